"""The scheduling loop: one thread per replica that owns the device, and its asyncio side.

Each turn packs waiting tasks into a batch under a token budget, launches it, and only then
finishes the previous batch (docs/ARCHITECTURE.md, "The scheduler"): the device works on batch
N+1 while the host reads batch N's results. With overlap=False, or an engine whose launch
computes the batch (the CPU), the same code finishes every batch right after launching it.
`run_job` is the replica's event-loop side: admission against the queue-wait bound in seconds
of the measured throughput (docs/ARCHITECTURE.md, "Load control"), then one future per
sequence, settled from the loop thread.

Tasks, their callbacks, cancellation and clocks live here; the engine it drives (`BatchEngine`,
gpu_worker/forward/engine.py) sees only packed sequences and label ids. No torch here.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from gpu_worker.serving.adapter_slots import AdapterSlots
from ranker_contract.config import SchedulerConfig
from ranker_contract.errors import ScorerOverloaded
from ranker_contract.packing import PackedSequence, ScoredJob, ScoreJob

logger = logging.getLogger(__name__)

# Receives a task's result (items × labels log-probs) or the exception that failed it.
DoneCallback = Callable[[list[list[float]] | BaseException], None]


class BatchAbandoned(Exception):
    """A synchronous engine stopped computing a batch whose every caller went away."""


class BatchEngine(Protocol):
    """The device side the loop drives (gpu_worker/forward/engine.py::Engine; tests use a fake)."""

    # True: launch() queues the batch and returns before it is computed (CUDA), so the loop may
    # launch the next before finishing it. False: launch() computed it (the CPU); finishing it
    # only after the next batch ran would hold its answers behind that batch for nothing.
    asynchronous: bool

    def launch(self, sequences: list[PackedSequence], label_ids_per_sequence: list[list[int]],
               *, adapters: list[int] | None = None, cache_owners: list[str] | None = None,
               abandoned: Callable[[], bool] | None = None) -> Any:
        """Queue one batch without waiting for it (another may still be running); returns its
        step. `adapters`: per sequence, its LoRA adapter's slot (0: the model itself); None when
        no sequence has one. `cache_owners`: per sequence, whose prefix-cache entries it reads
        and fills (ScoreTask.cache_owner); None when all are "". `abandoned`: True once nobody
        waits for any of the batch's results; a synchronous engine asks it as it computes and
        raises BatchAbandoned, so no work is done behind an expired request."""

    def finish(self, step: Any) -> list[list[list[float]]]:
        """Wait for a launched step: per sequence, one row of label log-probs per item."""


@dataclass(slots=True)
class JobStart:
    """Shared by the tasks of one job: set once any of them is picked into a batch. The queue-wait
    bound is on a job's start: a large job's later sequences wait behind its own first ones."""

    started: bool = False


@dataclass(slots=True)
class ScoreTask:
    """One packed sequence waiting to be scored, with its request's label ids."""

    sequence: PackedSequence
    label_ids: list[int]
    on_done: DoneCallback
    # True once nobody waits for the result (the caller went away): the loop drops the task.
    cancelled: Callable[[], bool] = lambda: False
    arrived: float = field(default_factory=time.monotonic)  # for the queue-wait bound
    launched: float = 0.0  # time.monotonic() when its batch was launched (set by the scheduler)
    job: JobStart = field(default_factory=JobStart)  # the job's other tasks hold the same one
    # the LoRA adapter (ScoreJob.adapter): its slot in the engine, or with AdapterSlots the
    # number a request names it by
    adapter: int = 0
    cache_owner: str = ""  # whose prefix-cache entries it reads and fills (ScoreJob's)
    bulk: bool = False  # its job's priority class (ScoreJob.bulk)
    # Both guarded by the scheduler's lock. `off_queue`: it left the queued count (picked into a
    # batch or dropped). `abandoned`: its caller went away while it was counted queued, so it
    # counts as queued no more (Scheduler.depth): the loop drops it at its next pick, which may
    # be a whole batch later, and work nobody waits for must not refuse new jobs meanwhile.
    off_queue: bool = False
    abandoned: bool = False

    @property
    def num_tokens(self) -> int:
        return self.sequence.num_tokens


@dataclass(slots=True)
class Load:
    """Tokens and sequences in one state (queued, or in flight)."""

    tokens: int = 0
    sequences: int = 0

    def add(self, tokens: int, sequences: int) -> None:
        self.tokens += tokens
        self.sequences += sequences

    def remove(self, tokens: int, sequences: int) -> None:
        self.tokens -= tokens
        self.sequences -= sequences


@dataclass(slots=True)
class _Launched:
    """A batch on the device: the engine's step, and the tasks it settles."""

    step: Any
    tasks: list[ScoreTask]
    started: float  # time.perf_counter() at its launch, for BatchRecord.seconds


@dataclass(frozen=True, slots=True)
class QueueDepth:
    queued_tokens: int
    queued_sequences: int
    inflight_tokens: int
    inflight_sequences: int

    @property
    def empty(self) -> bool:
        """Nothing accepted is unanswered."""
        return self.queued_sequences == 0 and self.inflight_sequences == 0

    @staticmethod
    def total(schedulers: list[Scheduler]) -> QueueDepth:
        """The depths of several loops added up (the models one replica holds)."""
        depths = [s.depth() for s in schedulers]
        return QueueDepth(*(sum(getattr(d, f.name) for d in depths) for f in fields(QueueDepth)))


# A batch of at least this share of the budget measures the device's throughput: smaller ones
# are launch-bound and would read the capacity low.
FULL_BATCH_SHARE = 0.5
THROUGHPUT_SMOOTHING = 0.3  # weight of the newest full batch in the moving average


@dataclass(slots=True)
class Throughput:
    """Tokens per second the device computes in full batches: the start-up probe's rate at first
    (0.0 where none was given), then a moving average over the full batches this loop ran.
    Written by the loop thread, read by the event loop (one float)."""

    tokens_per_s: float
    full_batch_tokens: int

    def observe(self, tokens: int, busy_s: float) -> None:
        if tokens < self.full_batch_tokens or busy_s <= 0:
            return
        rate = tokens / busy_s
        self.tokens_per_s = (rate if not self.tokens_per_s else
                             (1 - THROUGHPUT_SMOOTHING) * self.tokens_per_s
                             + THROUGHPUT_SMOOTHING * rate)


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One finished (or failed) batch, for metrics."""

    tokens: int
    sequences: int
    items: int
    seconds: float  # launch to results on the host (includes waiting behind the previous batch)
    error: str | None  # exception type name when the batch failed


class Scheduler:
    def __init__(self, engine: BatchEngine, cfg: SchedulerConfig,
                 batch_token_budget: int, adapters: AdapterSlots | None = None,
                 capacity_tokens_per_s: float = 0.0) -> None:
        """`batch_token_budget`: tokens per batch, resolved from the YAML's cap
        (`cfg.max_batch_tokens`, 0 = from free memory) by
        gpu_worker/forward/startup.py::measure_budget. `adapters`: the engine's adapter slots, which
        this loop fills on first use (tasks name adapters); None: tasks name slots.
        `capacity_tokens_per_s`: the warm-up probe's rate (0.0: not measured), where the
        throughput estimate starts."""
        if batch_token_budget <= 0:
            raise ValueError(f"batch_token_budget must be a resolved token count (> 0), not "
                             f"{batch_token_budget}")
        self.engine = engine
        self.batch_token_budget = batch_token_budget
        self.max_batch_sequences = cfg.max_batch_sequences
        self.overlap = cfg.overlap and engine.asynchronous
        self.max_queue_wait_s = cfg.max_queue_wait_s
        self.bulk_floor_share = cfg.bulk_floor_share
        self.throughput = Throughput(capacity_tokens_per_s,
                                     int(FULL_BATCH_SHARE * batch_token_budget))
        self._last_done = 0.0  # time.perf_counter() when the last batch's results were read
        self._incoming: queue.SimpleQueue[tuple[ScoreTask, ...]] = queue.SimpleQueue()
        # Online and bulk tasks wait apart: a batch takes bulk's floor share, then online work,
        # then bulk again in what is left (_pick).
        self._waiting: collections.deque[ScoreTask] = collections.deque()
        self._bulk_waiting: collections.deque[ScoreTask] = collections.deque()
        # Tokens bulk may take ahead of online work: a floor share of each batch's budget,
        # accrued while bulk waits, at most one budget.
        self._bulk_credit = 0
        self._bulk_deferred = False  # the last batch left bulk's share out (_pick)
        self.adapters = adapters
        if adapters is not None:
            adapters.on_read_done = lambda: self._incoming.put(())  # wakes the loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="score-loop", daemon=True)
        self._lock = threading.Lock()  # guards the counters below
        self._queued = Load()  # submitted and not yet launched
        self._abandoned = Load()  # of those, the tasks whose caller went away (ScoreTask)
        self._queued_bulk = Load()  # of the queued ones not abandoned, those of bulk jobs
        self._inflight = Load()  # launched and not yet finished
        self.batches_run = 0
        self.batches_abandoned = 0  # stopped part-way: every caller had gone (BatchAbandoned)
        self.cancelled_dropped = 0  # tasks skipped because their caller went away
        self.expired_dropped = 0  # tasks answered "overloaded": they waited past max_queue_wait_s
        # Tokens turned away (admission) or expired in the queue: demand the autoscaler must
        # still see, or shedding would hide the load that should add a replica.
        self.refused_tokens = 0
        # Tokens of finished batches: the autoscaler compares their rate with the capacity the
        # warm-up probe measured, a share that rises with the load before any queue forms.
        self.tokens_computed = 0
        # Finished batches for a metrics reader to drain; bounded so nobody reading costs nothing.
        self.batch_log: collections.deque[BatchRecord] = collections.deque(maxlen=4096)

    def submit(self, *tasks: ScoreTask) -> None:
        """Thread-safe. The tasks reach the loop together, so a job's sequences that fit one
        batch are launched in one (the loop never wakes to a part of them). Each task's on_done
        runs on the loop thread."""
        tokens = sum(t.num_tokens for t in tasks)
        bulk = [t for t in tasks if t.bulk]
        with self._lock:
            self._queued.add(tokens, len(tasks))
            self._queued_bulk.add(sum(t.num_tokens for t in bulk), len(bulk))
        self._incoming.put(tasks)

    async def run_job(self, job: ScoreJob) -> ScoredJob:
        """Submit every sequence of a job and wait for all: per sequence, items × label log-probs,
        with the time the job waited for its first launch and the time from there to its end.

        Admission, with `max_queue_wait_s` > 0: a job that could not start within it, the
        tokens ahead of it (queued and in flight) being more than the throughput computes in
        that time (`queue_bound_tokens`; without a rate, none is refused here), raises
        ScorerOverloaded, nothing queued. An online job counts only the online tokens queued
        ahead (bulk ones run after it, but for bulk's floor share), a bulk job every one: so
        bulk is refused first. A job always gets in when nothing waits, so a
        request larger than the bound is slow, never refused forever. A job none of whose
        sequences has started `max_queue_wait_s` after it arrived (the estimate was wrong)
        fails the same way, its sequences dropped unscored; once one has started, the rest
        run.
        """
        depth = self.depth()
        tokens = sum(seq.num_tokens for seq in job.sequences)
        queued = depth.queued_tokens
        if not job.bulk:
            with self._lock:
                queued -= self._queued_bulk.tokens
        ahead = queued + depth.inflight_tokens
        bound = self.queue_bound_tokens()
        if bound is not None and queued > 0 and ahead > bound:
            with self._lock:
                self.refused_tokens += tokens
            raise ScorerOverloaded(
                f"{ahead} tokens ahead, more than {self.max_queue_wait_s:g} s of work at "
                f"{self.throughput.tokens_per_s:.0f} tokens/s")
        loop = asyncio.get_running_loop()
        arrived = time.monotonic()
        futures, tasks, start = [], [], JobStart()
        for seq in job.sequences:
            fut = loop.create_future()
            # NOTE: if the request is cancelled (client gone, timeout), gather cancels these
            # futures; the loop thread reads fut.cancelled() and drops the task unscored.
            tasks.append(ScoreTask(seq, job.label_ids, _resolver(loop, fut), fut.cancelled,
                                   arrived, job=start, adapter=job.adapter,
                                   cache_owner=job.cache_owner, bulk=job.bulk))
            futures.append(fut)
        self.submit(*tasks)
        try:
            results = list(await asyncio.gather(*futures))
        except (ScorerOverloaded, asyncio.CancelledError):
            for fut in futures:  # nobody will read the rest: never compute it
                fut.cancel()
            self._abandon(tasks)
            raise
        first_launch = min((t.launched for t in tasks), default=arrived)
        return ScoredJob(results, queued_s=first_launch - arrived,
                         computed_s=time.monotonic() - first_launch)

    def _abandon(self, tasks: list[ScoreTask]) -> None:
        """Their futures are cancelled: those still queued stop counting as queued now."""
        with self._lock:
            for task in tasks:
                if not task.off_queue and not task.abandoned:
                    task.abandoned = True
                    self._abandoned.add(task.num_tokens, 1)
                    if task.bulk:
                        self._queued_bulk.remove(task.num_tokens, 1)

    def _off_queue(self, tasks: list[ScoreTask]) -> None:
        """Take tasks off the queued count (the caller holds the lock)."""
        for task in tasks:
            task.off_queue = True
            self._queued.remove(task.num_tokens, 1)
            if task.abandoned:
                self._abandoned.remove(task.num_tokens, 1)
            elif task.bulk:
                self._queued_bulk.remove(task.num_tokens, 1)

    def queue_bound_tokens(self) -> int | None:
        """Tokens that may be ahead of a job admitted now: what the measured throughput computes
        in max_queue_wait_s. None: no bound, or no rate known (a loop started without the
        probe's rate, before its first full batch), when only the wait itself refuses (a job not
        started in time)."""
        rate = self.throughput.tokens_per_s
        return int(rate * self.max_queue_wait_s) if rate and self.max_queue_wait_s > 0 else None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def depth(self) -> QueueDepth:
        """Queued (less what nobody waits for any more) and in flight."""
        with self._lock:
            return QueueDepth(self._queued.tokens - self._abandoned.tokens,
                              self._queued.sequences - self._abandoned.sequences,
                              self._inflight.tokens, self._inflight.sequences)

    def _run(self) -> None:
        inflight: _Launched | None = None
        stuck = False  # the last turn launched nothing though tasks wait (adapters loading)
        while not self._stop.is_set():
            self._admit(block=inflight is None
                        and (stuck or not (self._waiting or self._bulk_waiting)))
            if self.adapters is not None:
                self._fail_adapters(self.adapters.step())
            launched = None
            batch = self._pick()
            stuck = not batch
            if batch:
                launched = self._launch(batch)
                if launched is not None and not self.overlap:
                    self._finish(launched)
                    launched = None
            if inflight is not None:
                self._finish(inflight)
            inflight = launched
        if inflight is not None:
            self._finish(inflight)
        self._fail_all_waiting(RuntimeError("the scorer replica is shutting down"))

    def _admit(self, block: bool) -> None:
        try:
            if block:
                self._add_waiting(self._incoming.get(timeout=0.05))
            while True:
                self._add_waiting(self._incoming.get_nowait())
        except queue.Empty:
            pass

    def _add_waiting(self, tasks: tuple[ScoreTask, ...]) -> None:
        for task in tasks:
            (self._bulk_waiting if task.bulk else self._waiting).append(task)
        if self.adapters is not None:
            self.adapters.users.update(t.adapter for t in tasks if t.adapter)

    def _gone(self, tasks: list[ScoreTask]) -> None:
        """These tasks left the loop (answered or dropped): their adapters may be unloaded."""
        if self.adapters is not None:
            self.adapters.users.subtract(t.adapter for t in tasks if t.adapter)

    def _fail_adapters(self, failed: dict[int, BaseException]) -> None:
        """Fail the waiting tasks of adapters that could not be loaded."""
        if not failed:
            return
        tasks = [t for t in (*self._waiting, *self._bulk_waiting) if t.adapter in failed]
        self._waiting = collections.deque(t for t in self._waiting if t.adapter not in failed)
        self._bulk_waiting = collections.deque(t for t in self._bulk_waiting
                                               if t.adapter not in failed)
        with self._lock:
            self._off_queue(tasks)
        self._gone(tasks)
        for task in tasks:
            self._answer(task, failed[task.adapter])

    def _pick(self) -> list[ScoreTask]:
        """The next batch: bulk tasks up to bulk's credit (its floor share, so that bulk is never
        starved), then online tasks, then bulk ones in what is left of the budget."""
        batch: list[ScoreTask] = []
        now, tokens = time.monotonic(), 0
        if not self._bulk_waiting:
            self._bulk_credit = 0
        else:
            self._bulk_credit = min(self._bulk_credit + int(self.bulk_floor_share
                                                            * self.batch_token_budget),
                                    self.batch_token_budget)
            # Not when it would keep the next online task out of the batch (one larger than
            # the budget runs alone), but then in the batch after: neither class waits forever.
            front = self._waiting[0].num_tokens if self._waiting else 0
            if front + self._bulk_credit <= self.batch_token_budget or self._bulk_deferred:
                tokens = self._fill(batch, self._bulk_waiting, 0, self._bulk_credit, now)
                self._bulk_credit -= tokens
                self._bulk_deferred = False
            else:
                self._bulk_deferred = True
        tokens = self._fill(batch, self._waiting, tokens, self.batch_token_budget, now)
        tokens = self._fill(batch, self._bulk_waiting, tokens, self.batch_token_budget, now)
        if batch:
            with self._lock:
                self._off_queue(batch)
                self._inflight.add(tokens, len(batch))
        return batch

    def _fill(self, batch: list[ScoreTask], waiting: collections.deque[ScoreTask], tokens: int,
              limit: int, now: float) -> int:
        """Move tasks from the front of `waiting` into `batch` while its tokens stay within
        `limit` (the budget, or bulk's credit); returns the batch's tokens. Tasks nobody waits
        for, or that waited too long, are dropped on the way."""
        skipped: list[ScoreTask] = []  # their adapter is not loaded yet: they keep their place
        # A task bigger than the whole budget still runs, alone; bulk's credit is never passed.
        alone_ok = limit == self.batch_token_budget
        while waiting and len(batch) < self.max_batch_sequences:
            task = waiting.popleft()
            if task.cancelled():  # its caller disconnected or timed out: never computed
                self._drop(task)
                self.cancelled_dropped += 1
                continue
            if (0 < self.max_queue_wait_s < now - task.arrived
                    and not task.job.started):  # too late to be worth computing
                self._drop(task)
                self.expired_dropped += 1
                with self._lock:
                    self.refused_tokens += task.num_tokens
                self._answer(task, ScorerOverloaded(
                    f"waited {now - task.arrived:.2f} s in the queue (limit "
                    f"{self.max_queue_wait_s:g} s)"))
                continue
            if self.adapters is not None and not self.adapters.ready(task.adapter):
                skipped.append(task)
                continue
            if tokens + task.num_tokens > limit and (batch or not alone_ok):
                waiting.appendleft(task)
                break
            batch.append(task)
            task.job.started = True
            tokens += task.num_tokens
        waiting.extendleft(reversed(skipped))
        return tokens

    def _drop(self, task: ScoreTask) -> None:
        """A task taken off the queue unscored."""
        with self._lock:
            self._off_queue([task])
        self._gone([task])

    def _launch(self, batch: list[ScoreTask]) -> _Launched | None:
        started = time.perf_counter()
        launched = time.monotonic()
        for task in batch:
            task.launched = launched
        try:
            adapters = [t.adapter for t in batch]
            if self.adapters is not None:
                self.adapters.used(adapters)
                adapters = [self.adapters.slot(a) for a in adapters]
            if any(adapters):
                # One run of rows per adapter: its LoRA GEMMs read slices (gpu_worker/model/lora.py)
                order = sorted(range(len(batch)), key=adapters.__getitem__)
                batch[:] = [batch[k] for k in order]
                adapters = [adapters[k] for k in order]
            owners = [t.cache_owner for t in batch]
            step = self.engine.launch([t.sequence for t in batch], [t.label_ids for t in batch],
                                      adapters=adapters if any(adapters) else None,
                                      cache_owners=owners if any(owners) else None,
                                      abandoned=lambda: all(t.cancelled() for t in batch))
        except BatchAbandoned as exc:
            # Nobody reads its answers: neither a batch run nor a failure (the metrics'
            # ranker_batch_errors), only counted here.
            self.batches_abandoned += 1
            self._settle(batch, exc)
            return None
        except Exception as exc:  # noqa: BLE001 - one bad batch must not stop the loop
            logger.exception("launching a batch of %d sequences failed", len(batch))
            self._record(batch, started, exc)
            self._settle(batch, exc)
            return None
        return _Launched(step, batch, started)

    def _finish(self, launched: _Launched) -> None:
        tasks = launched.tasks
        try:
            results = self.engine.finish(launched.step)
        except Exception as exc:  # noqa: BLE001
            logger.exception("finishing a batch of %d sequences failed", len(tasks))
            self._record(tasks, launched.started, exc)
            self._settle(tasks, exc)
            return
        self.batches_run += 1
        done = time.perf_counter()
        # The device worked on it from its launch, or from the previous batch's end if later.
        self.throughput.observe(sum(t.num_tokens for t in tasks),
                                done - max(launched.started, self._last_done))
        self._last_done = done
        self._record(tasks, launched.started, None)
        self._settle(tasks, results)

    def _record(self, tasks: list[ScoreTask], started: float, exc: Exception | None) -> None:
        self.batch_log.append(BatchRecord(
            tokens=sum(t.num_tokens for t in tasks),
            sequences=len(tasks),
            items=sum(t.sequence.num_items for t in tasks),
            seconds=time.perf_counter() - started,
            error=None if exc is None else type(exc).__name__,
        ))

    def _settle(self, tasks: list[ScoreTask], outcome: list | BaseException) -> None:
        tokens = sum(t.num_tokens for t in tasks)
        with self._lock:
            self._inflight.remove(tokens, len(tasks))
            if not isinstance(outcome, BaseException):
                self.tokens_computed += tokens
        self._gone(tasks)
        for i, task in enumerate(tasks):
            self._answer(task, outcome if isinstance(outcome, BaseException) else outcome[i])

    @staticmethod
    def _answer(task: ScoreTask, result: list | BaseException) -> None:
        try:
            task.on_done(result)
        except Exception:  # noqa: BLE001 - a broken callback must not stop the loop
            logger.exception("a completion callback failed")

    def _fail_all_waiting(self, exc: BaseException) -> None:
        self._admit(block=False)
        tasks = [*self._waiting, *self._bulk_waiting]
        self._waiting.clear()
        self._bulk_waiting.clear()
        with self._lock:
            self._off_queue(tasks)
            self._inflight.add(sum(t.num_tokens for t in tasks), len(tasks))
        self._settle(tasks, exc)


def _resolver(loop: asyncio.AbstractEventLoop, fut: asyncio.Future) -> DoneCallback:
    def on_done(result):
        loop.call_soon_threadsafe(_settle_future, fut, result)

    return on_done


def _settle_future(fut: asyncio.Future, result) -> None:
    if fut.done():  # the caller went away
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)
