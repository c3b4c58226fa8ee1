"""The scorer replica as a Ray Serve deployment."""

from __future__ import annotations

import logging
import time

from ray import serve

from gpu_worker.metrics import WorkerMetrics
from gpu_worker.replica import start_scorer
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


@serve.deployment(**DEFAULT_OPTIONS)
class ScoreWorker:
    def __init__(self, config: AppConfig) -> None:
        scorer = start_scorer(config)
        # The probe's rate, what record_autoscaling_stats compares the computed rate with.
        self.capacity_tokens_per_s = scorer.budget.capacity_tokens_per_s
        self.scheduler = scorer.scheduler
        cache = scorer.engine.prefix_cache
        self.metrics = WorkerMetrics(self.scheduler, cache.stats if cache else None,
                                     config.model_names)
        # refused and computed tokens at the last stats report, and when it was
        self._last_report = (0, 0, time.monotonic())
        logger.info("ScoreWorker ready: %s", config)

    async def score(self, job: ScoreJob) -> ScoredJob | ScorerOverloaded:
        """Per sequence, items × label log-probs (and where the job's time went); or the
        refusal, returned as a value (see ranker_contract/errors.py: no traceback logged per
        refusal)."""
        try:
            return await self.scheduler.run_job(job)
        except ScorerOverloaded as refusal:
            self.metrics.rejected.inc()
            return refusal

    def record_autoscaling_stats(self) -> dict[str, float]:
        # Read by the autoscaling policy (ranker_app/autoscaling_policy.py).
        depth = self.scheduler.depth()
        refused, computed = self.scheduler.refused_tokens, self.scheduler.tokens_computed
        now = time.monotonic()
        refused_before, computed_before, since = self._last_report
        self._last_report = (refused, computed, now)
        elapsed = max(now - since, 1e-3)
        capacity = self.capacity_tokens_per_s
        return {
            "queued_tokens": depth.queued_tokens,
            "inflight_tokens": depth.inflight_tokens,
            "queued_sequences": depth.queued_sequences,
            "inflight_sequences": depth.inflight_sequences,
            "refused_tokens_per_s": (refused - refused_before) / elapsed,
            # computed tokens/s as a share of the measured capacity (0 where not measured)
            "demand_share": (computed - computed_before) / elapsed / capacity if capacity else 0.0,
        }

    def ping(self) -> bool:
        self.check_health()
        return True

    def check_health(self) -> None:
        if not self.scheduler.alive:
            raise RuntimeError("the scheduling loop thread died")

    def __del__(self) -> None:
        if getattr(self, "metrics", None) is not None:
            self.metrics.stop()
        if getattr(self, "scheduler", None) is not None:
            self.scheduler.stop()
