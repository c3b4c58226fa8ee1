"""The scorer replica as a Ray Serve deployment."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ray import serve

from gpu_worker.serving.metrics import WorkerMetrics
from gpu_worker.serving.replica import Scorer, release_memory, start_scorer
from gpu_worker.serving.scheduler import QueueDepth, Scheduler
from ranker_contract.config import AppConfig
from ranker_contract.errors import ScorerOverloaded
from ranker_contract.packing import ScoredJob, ScoreJob

logger = logging.getLogger(__name__)

# Code defaults; configs/*.yaml may override any of them per deployment.
DEFAULT_OPTIONS = {
    # The replica batches internally: let many requests in so its loop always has work.
    "max_ongoing_requests": 1024,
    "ray_actor_options": {"num_cpus": 1, "num_gpus": 0},
    "health_check_period_s": 5,
    # A replica being removed first finishes what it accepted (Serve stops routing to it).
    "graceful_shutdown_timeout_s": 120,
}


# An unloaded model first answers what it accepted, for at most this long.
UNLOAD_DRAIN_S = 60.0


class MultiplexedModel:
    """One of `models` loaded on this replica. Serve's multiplexer keeps it, least recently used
    first, and calls __del__ when it unloads it; the GC may call it again after that."""

    def __init__(self, scorer: Scorer, forget: Callable[[Scorer], None]) -> None:
        self.scorer: Scorer | None = scorer
        self._forget = forget  # the replica publishes its last batches and stops counting it

    def __del__(self) -> None:
        scorer, self.scorer = getattr(self, "scorer", None), None
        if scorer is not None:
            scorer.stop(drain_s=UNLOAD_DRAIN_S)
            self._forget(scorer)
            del scorer
            release_memory()


@serve.deployment(**DEFAULT_OPTIONS)
class ScoreWorker:
    async def __init__(self, config: AppConfig) -> None:
        # async (Serve awaits a coroutine constructor): the preloads go through Serve's
        # multiplexer, an async API, before the replica reports ready.
        scorer = start_scorer(config, memory_share=config.memory_share)
        # The probe's rate, what record_autoscaling_stats compares the computed rate with.
        self.capacity_tokens_per_s = scorer.budget.capacity_tokens_per_s
        self.scheduler = scorer.scheduler
        self.multiplexed: dict[str, MultiplexedModel] = {}  # loaded models of `models`
        if config.models:
            # Wired here, not as a decorated method: the per-replica limit is the config's.
            self._model = serve.multiplexed(
                max_num_models_per_replica=config.multiplex.max_models_per_replica)(
                    self._load_model_of(config))
        cache = scorer.engine.prefix_cache
        self.metrics = WorkerMetrics(self.scheduler, cache.stats if cache else None,
                                     config.model_names, lambda: self._schedulers()[1:])
        # refused and computed tokens at the last stats report, and when it was
        self._last_report = (0, 0, time.monotonic())
        for name in config.multiplex.preload:
            await self._model(name)
        logger.info("ScoreWorker ready: %s", config)

    def _load_model_of(self, config: AppConfig):
        async def load(name: str) -> MultiplexedModel:
            # In a thread: the replica goes on taking and answering requests meanwhile.
            scorer = await asyncio.to_thread(start_scorer, config.multiplexed(name), None,
                                             config.memory_share)
            model = MultiplexedModel(scorer, lambda stopped: self._forget(name, stopped))
            self.multiplexed[name] = model
            return model

        return load

    def _forget(self, name: str, scorer: Scorer) -> None:
        self.metrics.publish_batches(scorer.scheduler)
        self.multiplexed.pop(name, None)

    async def score(self, job: ScoreJob) -> ScoredJob | ScorerOverloaded:
        """Per sequence, items × label log-probs (and where the job's time went); or the
        refusal, returned as a value (see ranker_contract/errors.py: no traceback logged per
        refusal). A job of one of `models` loads it here first if need be."""
        scheduler = self.scheduler
        if job.model is not None:
            try:
                scheduler = (await self._model(job.model)).scorer.scheduler
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory: this replica can't
                logger.exception("could not load model %r", job.model)
                return ScorerOverloaded(f"model {job.model!r} could not be loaded on a scorer "
                                        f"replica: {type(exc).__name__}: {exc}")
        try:
            return await scheduler.run_job(job)
        except ScorerOverloaded as refusal:
            self.metrics.rejected.inc()
            return refusal

    def _schedulers(self) -> list[Scheduler]:
        return [self.scheduler, *(m.scorer.scheduler for m in list(self.multiplexed.values())
                                  if m.scorer is not None)]

    def record_autoscaling_stats(self) -> dict[str, float]:
        # Read by the autoscaling policy (ranker_app/autoscaling_policy.py).
        # Every model's loop on this replica: they share its GPU.
        schedulers = self._schedulers()
        depth = QueueDepth.total(schedulers)
        refused = sum(s.refused_tokens for s in schedulers)
        computed = sum(s.tokens_computed for s in schedulers)
        now = time.monotonic()
        refused_before, computed_before, since = self._last_report
        self._last_report = (refused, computed, now)
        elapsed = max(now - since, 1e-3)
        capacity = self.capacity_tokens_per_s
        # (a model unloaded since takes its totals with it: that report's rates read 0)
        return {
            "queued_tokens": depth.queued_tokens,
            "inflight_tokens": depth.inflight_tokens,
            "queued_sequences": depth.queued_sequences,
            "inflight_sequences": depth.inflight_sequences,
            "refused_tokens_per_s": max(0, refused - refused_before) / elapsed,
            # computed tokens/s as a share of the measured capacity (0 where not measured)
            "demand_share": (max(0, computed - computed_before) / elapsed / capacity
                             if capacity else 0.0),
        }

    def ping(self) -> bool:
        self.check_health()
        return True

    def check_health(self) -> None:
        if not all(s.alive for s in self._schedulers()):
            raise RuntimeError("a scheduling loop thread died")

    def __del__(self) -> None:
        if getattr(self, "metrics", None) is not None:
            self.metrics.stop()
        for model in list(getattr(self, "multiplexed", {}).values()):
            model.__del__()
        if getattr(self, "scheduler", None) is not None:
            self.scheduler.stop()
