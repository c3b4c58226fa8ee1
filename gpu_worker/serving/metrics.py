"""Prometheus metrics of a scorer replica (ray.serve.metrics adds application/deployment/replica).

A small thread publishes them from the scheduler's counters every PUBLISH_INTERVAL_S, so the
scheduling loop itself never calls into the metrics library. Every counter series exists from
start-up at 0, for the reason given in ranker_contract/metrics.py (Prometheus takes a series' first
sample as its baseline).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from ray.serve.metrics import Counter, Gauge, Histogram

from gpu_worker.attention.prefix_cache import PrefixCacheStats
from gpu_worker.serving.scheduler import QueueDepth, Scheduler
from ranker_contract.metrics import declare_at_zero

PUBLISH_INTERVAL_S = 0.5
TOKEN_BUCKETS = [256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
SEQUENCE_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
STEP_BUCKETS_S = [0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5, 1,
                  2, 5, 10, 30, 60, 120]
# error_type of a failed batch: these names, any other exception as "other" (the replica's log
# names it), so that every series exists before the first failure.
BATCH_ERROR_TYPES = ("OutOfMemoryError", "AcceleratorError", "RuntimeError", "other")


CACHE_RESULTS = tuple(PrefixCacheStats().lookups())  # the result labels of the lookups


def add_growth(counter: Counter, now: int, seen: int, tags: dict[str, str] | None = None) -> None:
    """Add to `counter` what a running total grew by since it was `seen`."""
    if now > seen:
        counter.inc(now - seen, tags=tags)


def batch_error_type(name: str) -> str:
    return name if name in BATCH_ERROR_TYPES else "other"


class WorkerMetrics:
    def __init__(self, scheduler: Scheduler, cache: PrefixCacheStats | None,
                 model_names: list[str],
                 others: Callable[[], list[Scheduler]] = lambda: []) -> None:
        """`model_names`: what requests name the model (first) and its adapters by. `others`:
        the loops of the other models loaded now (`models`), whose queues and batches count
        with `scheduler`'s; the prefix cache and adapters are `scheduler`'s engine's."""
        self.scheduler = scheduler
        self.others = others
        self.cache = cache  # None: no prefix cache, its series stay at 0
        self.adapter_names = model_names[1:]  # adapter k is adapter_names[k - 1]
        self.queue_tokens = Gauge("ranker_queue_tokens", "Tokens waiting (queued) or running "
                                  "(inflight) in this replica", tag_keys=("state",))
        self.queue_sequences = Gauge("ranker_queue_sequences", "Packed sequences waiting "
                                     "(queued) or running (inflight)", tag_keys=("state",))
        self.batch_tokens = Histogram("ranker_batch_tokens", "Tokens per forward batch",
                                      boundaries=TOKEN_BUCKETS)
        self.batch_sequences = Histogram("ranker_batch_sequences", "Packed sequences (about "
                                         "requests) per forward batch", boundaries=SEQUENCE_BUCKETS)
        self.step_seconds = Histogram("ranker_step_seconds", "Launch to results of one batch",
                                      boundaries=STEP_BUCKETS_S)
        self.items_scored = Counter("ranker_items_scored", "Items scored")
        self.batch_errors = Counter("ranker_batch_errors", "Batches that failed, by exception",
                                    tag_keys=("error_type",))
        self.dropped = Counter("ranker_sequences_dropped", "Sequences dropped unscored because "
                               "their caller went away (disconnect or timeout)")
        self.rejected = Counter("ranker_requests_rejected", "Requests refused because the "
                                "replica was full: its token queue, or a wait past "
                                "max_queue_wait_s")
        self.cache_lookups = Counter("ranker_prefix_cache_lookups", "Queries looked up in the "
                                     "prefix cache: hit (all of it cached), partial (its first "
                                     "pages), miss (none; computed and kept) or bypass (not all "
                                     "cached, no room to keep it)", tag_keys=("result",))
        self.cache_tokens_reused = Counter("ranker_prefix_cache_tokens_reused", "Query tokens "
                                           "not computed thanks to a prefix-cache hit")
        self.cache_evictions = Counter("ranker_prefix_cache_evictions", "Pages evicted from "
                                       "the prefix cache (least recently used first)")
        self.cache_tokens = Gauge("ranker_prefix_cache_tokens", "Tokens of K/V held in the "
                                  "prefix cache")
        self.adapter_loads = Counter("ranker_adapter_loads", "LoRA adapters loaded on first "
                                     "use into a slot of this replica", tag_keys=("model",))
        self.adapter_unloads = Counter("ranker_adapter_unloads", "LoRA adapters unloaded (the "
                                       "least recently used idle one) for another",
                                       tag_keys=("model",))
        for name in self.adapter_names:
            declare_at_zero(self.adapter_loads, {"model": name})
            declare_at_zero(self.adapter_unloads, {"model": name})
        self._loads_seen = {"loads": [0] * len(model_names), "unloads": [0] * len(model_names)}
        for counter in (self.items_scored, self.dropped, self.rejected, self.cache_tokens_reused,
                        self.cache_evictions):
            declare_at_zero(counter)
        for result in CACHE_RESULTS:
            declare_at_zero(self.cache_lookups, {"result": result})
        self._cache_seen = PrefixCacheStats()
        for error_type in BATCH_ERROR_TYPES:
            declare_at_zero(self.batch_errors, {"error_type": error_type})
        self._dropped_seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(PUBLISH_INTERVAL_S):
            self.publish()

    def publish(self) -> None:
        schedulers = [self.scheduler, *self.others()]
        depth = QueueDepth.total(schedulers)
        self.queue_tokens.set(depth.queued_tokens, tags={"state": "queued"})
        self.queue_tokens.set(depth.inflight_tokens, tags={"state": "inflight"})
        self.queue_sequences.set(depth.queued_sequences, tags={"state": "queued"})
        self.queue_sequences.set(depth.inflight_sequences, tags={"state": "inflight"})
        for scheduler in schedulers:
            self.publish_batches(scheduler)
        # (a model unloaded since takes its count with it: only growth after that is added)
        dropped = sum(s.cancelled_dropped for s in schedulers)
        add_growth(self.dropped, dropped, self._dropped_seen)
        self._dropped_seen = dropped
        if self.cache is not None:
            self._publish_cache()
        else:
            self.cache_tokens.set(0)  # a gauge not set lately is not exported
        if self.scheduler.adapters is not None:
            self._publish_adapters()

    def publish_batches(self, scheduler: Scheduler) -> None:
        """The batches `scheduler` finished since last read (also called for a model's loop
        as it is unloaded, from another thread)."""
        while True:
            try:
                record = scheduler.batch_log.popleft()
            except IndexError:  # (read to the end, here or by the other thread)
                break
            if record.error is not None:
                self.batch_errors.inc(tags={"error_type": batch_error_type(record.error)})
                continue
            self.batch_tokens.observe(record.tokens)
            self.batch_sequences.observe(record.sequences)
            self.step_seconds.observe(record.seconds)
            self.items_scored.inc(record.items)

    def _publish_adapters(self) -> None:
        slots = self.scheduler.adapters
        for kind, counter in (("loads", self.adapter_loads), ("unloads", self.adapter_unloads)):
            now, seen = list(getattr(slots, kind)), self._loads_seen[kind]
            for adapter in range(1, len(now)):
                add_growth(counter, now[adapter], seen[adapter],
                           {"model": self.adapter_names[adapter - 1]})
            self._loads_seen[kind] = now

    def _publish_cache(self) -> None:
        now, seen = dataclasses.replace(self.cache), self._cache_seen  # a snapshot
        before = seen.lookups()
        for result, count in now.lookups().items():
            add_growth(self.cache_lookups, count, before[result], {"result": result})
        add_growth(self.cache_tokens_reused, now.tokens_reused, seen.tokens_reused)
        add_growth(self.cache_evictions, now.evictions, seen.evictions)
        self.cache_tokens.set(now.cached_tokens)
        self._cache_seen = now
