"""The scheduling loop on a fake engine (tests/cpu/fake_engine.py): batching, overlap, isolation
of failures, cancellation, the queue-wait bound. The real engine through the loop is tested in
test_engine_parity.py.

Tasks are submitted before start() wherever batch composition matters: the loop then admits them
all on its first turn and composes the same batches every run.
"""

from __future__ import annotations

import asyncio
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpu_worker.serving.scheduler import BatchAbandoned, JobStart, QueueDepth, Scheduler, ScoreTask
from ranker_contract.config import SchedulerConfig
from ranker_contract.errors import ScorerOverloaded
from ranker_contract.packing import PackedSequence, ScoreJob
from tests.cpu.fake_engine import FakeEngine, fake_scores
from tests.cpu.sequences import mixed_sequences

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30.0
LABELS = [0, 5, 511]
IDLE = QueueDepth(0, 0, 0, 0)


@pytest.fixture(scope="module")
def sequences() -> list[PackedSequence]:
    return mixed_sequences()


class Collector:
    """on_done callbacks for a list of tasks: results by index, and the thread each ran on."""

    def __init__(self) -> None:
        self.done: queue.Queue = queue.Queue()

    def callback(self, index: int):
        def on_done(result) -> None:
            self.done.put((index, result, threading.current_thread()))

        return on_done

    def wait(self, n: int) -> dict[int, object]:
        results = {}
        for _ in range(n):
            index, result, thread = self.done.get(timeout=TIMEOUT_S)
            assert thread is not threading.main_thread()
            assert thread.name == "score-loop"
            results[index] = result
        return results


def run_all(scheduler: Scheduler, seqs: list[PackedSequence]) -> list:
    """Submit everything before start(), wait for every result, stop; results in task order."""
    collector = Collector()
    for i, seq in enumerate(seqs):
        scheduler.submit(ScoreTask(seq, LABELS, collector.callback(i)))
    assert scheduler.depth() == QueueDepth(sum(s.num_tokens for s in seqs), len(seqs), 0, 0)
    scheduler.start()
    try:
        results = collector.wait(len(seqs))
        assert scheduler.depth() == IDLE
    finally:
        scheduler.stop()
    assert not scheduler.alive
    return [results[i] for i in range(len(seqs))]


def launch_before_finish(batches: int) -> list[tuple[str, int]]:
    """The overlap loop's order: batch N+1 is launched before batch N is finished."""
    events = [("launch", 0)]
    for n in range(1, batches):
        events += [("launch", n), ("finish", n - 1)]
    return events + [("finish", batches - 1)]


def test_the_scheduler_imports_no_torch():
    code = "import gpu_worker.serving.scheduler, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_overlap_equals_synchronous(sequences):
    runs = {}
    for overlap in (True, False):
        fake = FakeEngine()
        scheduler = Scheduler(fake, SchedulerConfig(max_batch_sequences=3, overlap=overlap),
                              batch_token_budget=120)
        runs[overlap] = (run_all(scheduler, sequences), scheduler.batches_run, fake)
    (overlapped, n, fake_overlap), (synchronous, n_sync, fake_sync) = runs[True], runs[False]
    assert n == n_sync > 1  # several batches, so overlap really overlapped
    assert fake_overlap.batches == fake_sync.batches
    assert fake_overlap.events == launch_before_finish(n)
    assert fake_sync.events == [(kind, k) for k in range(n) for kind in ("launch", "finish")]
    # With overlap every launch after the first finds the previous batch still on the device.
    assert fake_overlap.on_device_at_launch == [0] + [1] * (n - 1)
    assert fake_sync.on_device_at_launch == [0] * n
    assert overlapped == synchronous
    # ...and each result belongs to its own task (a mix-up would give equal but wrong results).
    assert overlapped == [fake_scores(seq, LABELS) for seq in sequences]


def test_an_engine_that_computes_at_launch_is_finished_at_once(sequences):
    """The CPU's launch computes its batch: each batch is answered before the next is launched,
    even with overlap on (else its answers would wait for the next batch's work)."""
    fake = FakeEngine(asynchronous=False)
    scheduler = Scheduler(fake, SchedulerConfig(max_batch_sequences=3, overlap=True),
                          batch_token_budget=120)
    assert run_all(scheduler, sequences) == [fake_scores(seq, LABELS) for seq in sequences]
    n = scheduler.batches_run
    assert n > 1
    assert fake.events == [(kind, k) for k in range(n) for kind in ("launch", "finish")]


@pytest.mark.parametrize("callers_left", ["all", "one of two"])
def test_a_computing_batch_stops_once_every_caller_has_gone(sequences, callers_left):
    """The CPU computes a batch inside launch(): asked before each layer, it stops a batch
    nobody waits for (a request expired while its batch ran), and the loop goes on with the
    next one; a batch that one caller still waits for is computed to the end."""
    fake = FakeEngine(asynchronous=False)
    scheduler = Scheduler(fake, SchedulerConfig(max_batch_sequences=2),
                          batch_token_budget=10_000)
    gone = [threading.Event(), threading.Event()]
    collector = Collector()
    for i in range(2):
        scheduler.submit(ScoreTask(sequences[i], LABELS, collector.callback(i),
                                   cancelled=gone[i].is_set))
    fake.hold_launch()
    scheduler.start()
    try:
        assert fake.launching.wait(TIMEOUT_S)
        for event in gone if callers_left == "all" else gone[:1]:
            event.set()  # the caller went away while its batch computes
        fake.release_launch()
        scheduler.submit(ScoreTask(sequences[2], LABELS, collector.callback(2)))
        results = collector.wait(3)
    finally:
        scheduler.stop()
    assert results[2] == fake_scores(sequences[2], LABELS)  # the loop went on
    if callers_left == "all":
        assert fake.events[0] == ("abandoned", 0) and scheduler.batches_abandoned == 1
        assert all(isinstance(results[i], BatchAbandoned) for i in range(2))
        # not a failed batch for the metrics (ranker_batch_errors): only the next one is logged
        assert [(r.sequences, r.error) for r in scheduler.batch_log] == [(1, None)]
    else:
        assert fake.events[:2] == [("launch", 0), ("finish", 0)]
        assert scheduler.batches_abandoned == 0
        assert results[1] == fake_scores(sequences[1], LABELS)
    assert scheduler.depth() == IDLE


def test_batches_across_requests(sequences):
    fake = FakeEngine()
    scheduler = Scheduler(fake, SchedulerConfig(max_batch_sequences=5), batch_token_budget=10_000)
    run_all(scheduler, sequences)
    assert [len(b) for b in fake.batches] == [5, 3]
    assert scheduler.batches_run == 2 < len(sequences)


def test_a_batch_reaches_the_engine_sorted_by_adapter_and_results_reach_their_tasks(sequences):
    """Each adapter's sequences in one run (its LoRA GEMMs read slices: gpu_worker/model/lora.py);
    base-only batches pass no adapters at all."""
    slots = [2, 0, 1, 2, 0, 1, 0, 2]
    fake = FakeEngine()
    scheduler = Scheduler(fake, SchedulerConfig(max_batch_sequences=8), batch_token_budget=10_000)
    collector = Collector()
    for i, (seq, slot) in enumerate(zip(sequences, slots, strict=True)):
        scheduler.submit(ScoreTask(seq, LABELS, collector.callback(i), adapter=slot))
    scheduler.start()
    try:
        results = collector.wait(len(slots))
    finally:
        scheduler.stop()
    assert fake.adapters == [[0, 0, 0, 1, 1, 2, 2, 2]]
    order = sorted(range(len(slots)), key=lambda i: slots[i])  # stable: arrival order per slot
    assert fake.batches == [[id(sequences[i]) for i in order]]
    assert [results[i] for i in range(len(slots))] == [fake_scores(seq, LABELS)
                                                       for seq in sequences]
    base_only = FakeEngine()
    run_all(Scheduler(base_only, SchedulerConfig(), batch_token_budget=10_000), sequences)
    assert base_only.adapters == [None]


def test_task_larger_than_budget_runs_alone(sequences):
    small = [seq for seq in sequences if seq.num_tokens <= 40][:3]
    big = max(sequences, key=lambda s: s.num_tokens)
    budget = 60
    assert big.num_tokens > budget and len(small) == 3
    fake = FakeEngine()
    order = [small[0], big, small[1], small[2]]
    # The YAML's cap (max_batch_tokens) is not the budget: the resolved one is passed apart.
    scheduler = Scheduler(fake, SchedulerConfig(max_batch_tokens=0, max_batch_sequences=8),
                          batch_token_budget=budget)
    results = run_all(scheduler, order)
    # The big task neither joins the batch before it nor takes the small ones after it along.
    assert fake.batches == [[id(small[0])], [id(big)], [id(small[1]), id(small[2])]]
    assert results[1] == fake_scores(big, LABELS)


def test_the_budget_must_be_resolved():
    with pytest.raises(ValueError, match="batch_token_budget"):
        Scheduler(FakeEngine(), SchedulerConfig(max_batch_tokens=0), batch_token_budget=0)


def test_failed_launch_fails_only_its_batch(sequences):
    poisoned = sequences[1]
    fake = FakeEngine(poisoned=(poisoned,))
    scheduler = Scheduler(fake, SchedulerConfig(max_batch_sequences=2), batch_token_budget=10_000)
    collector = Collector()
    for i, seq in enumerate(sequences[:4]):  # batches [0, 1*] and [2, 3]
        scheduler.submit(ScoreTask(seq, LABELS, collector.callback(i)))
    scheduler.start()
    try:
        first = collector.wait(4)
        assert isinstance(first[0], RuntimeError) and first[0] is first[1]
        assert str(first[0]) == "poisoned batch"
        assert all(isinstance(first[i], list) and len(first[i]) == sequences[i].num_items
                   for i in (2, 3))
        # The loop survived: a task submitted after the failure is still served.
        scheduler.submit(ScoreTask(sequences[5], LABELS, collector.callback(5)))
        later = collector.wait(1)
        assert isinstance(later[5], list) and len(later[5]) == sequences[5].num_items
        assert scheduler.depth() == IDLE
        assert scheduler.alive
        # Each batch left one record for the metrics, the failed one with its error type.
        records = list(scheduler.batch_log)
        assert [(r.error, r.sequences) for r in records] == [("RuntimeError", 2), (None, 2),
                                                             (None, 1)]
        assert records[1].tokens == sequences[2].num_tokens + sequences[3].num_tokens
        assert records[1].items == sequences[2].num_items + sequences[3].num_items
        assert all(r.seconds > 0 for r in records)
    finally:
        scheduler.stop()


def test_cancelled_task_is_dropped_unscored(sequences):
    fake = FakeEngine()
    scheduler = Scheduler(fake, SchedulerConfig(max_batch_sequences=64), batch_token_budget=10_000)
    collector = Collector()
    gone = threading.Event()
    gone.set()  # the caller of task 1 went away before the loop reached it
    for i, seq in enumerate(sequences[:3]):
        cancelled = gone.is_set if i == 1 else (lambda: False)
        scheduler.submit(ScoreTask(seq, LABELS, collector.callback(i), cancelled))
    scheduler.start()
    try:
        results = collector.wait(2)
        assert set(results) == {0, 2}
        assert [id(sequences[1]) in batch for batch in fake.batches] == [False] * len(fake.batches)
        assert scheduler.cancelled_dropped == 1
        assert scheduler.depth() == IDLE
        assert collector.done.empty()  # no callback for the dropped task
    finally:
        scheduler.stop()


def test_a_launched_task_runs_to_the_end_and_counts_in_flight(sequences):
    """While its batch is on the device a task counts as in flight; a caller going away then no
    longer stops it, and its result is still delivered."""
    fake = FakeEngine()
    fake.hold()
    scheduler = Scheduler(fake, SchedulerConfig(max_batch_sequences=64, overlap=False),
                          batch_token_budget=10_000)
    collector = Collector()
    gone = threading.Event()
    scheduler.submit(ScoreTask(sequences[0], LABELS, collector.callback(0), gone.is_set))
    scheduler.start()
    try:
        assert fake.finishing.wait(TIMEOUT_S)  # launched, held on the "device"
        assert scheduler.depth() == QueueDepth(0, 0, sequences[0].num_tokens, 1)
        gone.set()
        fake.release()
        assert collector.wait(1) == {0: fake_scores(sequences[0], LABELS)}
        assert scheduler.depth() == IDLE and scheduler.cancelled_dropped == 0
    finally:
        fake.release()
        scheduler.stop()


def test_task_waiting_past_the_queue_bound_is_refused_not_computed(sequences):
    """A task that arrived 10 s ago with a 5 s bound is answered ScorerOverloaded and never
    launched; a fresh task behind it is scored. Arrival times are set, not waited for."""
    fake = FakeEngine()
    scheduler = Scheduler(fake, SchedulerConfig(max_batch_sequences=8, max_queue_wait_s=5),
                          batch_token_budget=10_000)
    collector = Collector()
    stale, fresh = sequences[0], sequences[1]
    scheduler.submit(ScoreTask(stale, LABELS, collector.callback(0),
                               arrived=time.monotonic() - 10))
    scheduler.submit(ScoreTask(fresh, LABELS, collector.callback(1)))
    scheduler.start()
    try:
        results = collector.wait(2)
    finally:
        scheduler.stop()
    assert isinstance(results[0], ScorerOverloaded)
    assert "in the queue (limit 5 s)" in str(results[0])
    assert isinstance(results[1], list) and len(results[1]) == fresh.num_items
    assert fake.batches == [[id(fresh)]]
    assert scheduler.expired_dropped == 1 and scheduler.depth() == IDLE
    assert scheduler.refused_tokens == stale.num_tokens


def test_the_queue_bound_is_on_a_jobs_start_not_on_its_later_sequences(sequences):
    """Two tasks that arrived 10 s ago with a 5 s bound: the one whose job has started (its
    first sequences ran) is scored, so a large request is never cut off midway; the one whose
    job has not is refused."""
    fake = FakeEngine()
    scheduler = Scheduler(fake, SchedulerConfig(max_batch_sequences=8, max_queue_wait_s=5),
                          batch_token_budget=10_000)
    collector = Collector()
    long_ago = time.monotonic() - 10
    scheduler.submit(ScoreTask(sequences[0], LABELS, collector.callback(0), arrived=long_ago,
                               job=JobStart(started=True)))
    scheduler.submit(ScoreTask(sequences[1], LABELS, collector.callback(1), arrived=long_ago))
    scheduler.start()
    try:
        results = collector.wait(2)
    finally:
        scheduler.stop()
    assert results[0] == fake_scores(sequences[0], LABELS)
    assert isinstance(results[1], ScorerOverloaded)
    assert fake.batches == [[id(sequences[0])]] and scheduler.expired_dropped == 1


def test_a_jobs_sequences_reach_a_running_loop_together_and_share_one_batch(sequences):
    """run_job on a started, idle loop: the loop wakes once for the whole job, so a job that
    fits the budget is one batch (a loop woken by its first sequence alone would launch a part).
    The answer says how long the job waited for its launch and how long it computed."""
    fake = FakeEngine()
    scheduler = Scheduler(fake, SchedulerConfig(max_batch_sequences=64), batch_token_budget=10_000)
    scheduler.start()
    try:
        scored = asyncio.run(scheduler.run_job(ScoreJob(list(sequences), LABELS)))
    finally:
        scheduler.stop()
    assert fake.batches == [[id(s) for s in sequences]]
    assert [len(rows) for rows in scored.results] == [s.num_items for s in sequences]
    assert scored.results == [fake_scores(s, LABELS) for s in sequences]
    assert scored.queued_s >= 0 and scored.computed_s > 0


def test_tokens_computed_count_finished_batches_only(sequences):
    """The autoscaler's demand share reads tokens_computed: every token of a scored sequence,
    none of a batch that failed or of a task refused for waiting too long."""
    good, poisoned, stale = sequences[0], sequences[1], sequences[2]
    fake = FakeEngine(poisoned=(poisoned,))
    scheduler = Scheduler(fake, SchedulerConfig(max_batch_sequences=1, max_queue_wait_s=5),
                          batch_token_budget=10_000)
    collector = Collector()
    scheduler.submit(ScoreTask(good, LABELS, collector.callback(0)))
    scheduler.submit(ScoreTask(poisoned, LABELS, collector.callback(1)))
    scheduler.submit(ScoreTask(stale, LABELS, collector.callback(2), arrived=time.monotonic() - 10))
    assert scheduler.tokens_computed == 0
    scheduler.start()
    try:
        results = collector.wait(3)
    finally:
        scheduler.stop()
    assert isinstance(results[0], list) and isinstance(results[1], RuntimeError)
    assert isinstance(results[2], ScorerOverloaded)
    assert scheduler.tokens_computed == good.num_tokens
