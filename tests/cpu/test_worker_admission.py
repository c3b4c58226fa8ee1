"""Admission control (the queue-wait bound in seconds of the measured throughput) and health of
a scorer replica, without Serve, on a fake engine
(tests/cpu/fake_engine.py): admission and health do not depend on what the engine computes."""

import asyncio

import pytest

from gpu_worker.serving.deployment import ScoreWorker
from gpu_worker.serving.scheduler import (
    THROUGHPUT_SMOOTHING,
    QueueDepth,
    Scheduler,
    ScoreTask,
    Throughput,
)
from ranker_contract.config import SchedulerConfig
from ranker_contract.errors import ScorerOverloaded
from ranker_contract.packing import ScoreJob, pack_plain
from tests.cpu.fake_engine import FakeEngine

LABELS = [0, 5]
# a bound of 1 s at 100 tokens/s: 100 tokens may be ahead of a job admitted
LIMITED = SchedulerConfig(max_batch_sequences=8, max_queue_wait_s=1.0)
RATE = 100.0
BUDGET = 1000  # tokens per batch


def _job(tokens: int) -> ScoreJob:
    return ScoreJob([pack_plain(list(range(3, 3 + tokens)), 0)], LABELS)


def test_job_that_could_not_start_within_the_bound_is_refused_without_queueing():
    # The loop is not started, so everything submitted stays queued.
    scheduler = Scheduler(FakeEngine(), LIMITED, batch_token_budget=BUDGET,
                          capacity_tokens_per_s=RATE)
    assert scheduler.queue_bound_tokens() == 100

    async def scenario():
        first = asyncio.ensure_future(scheduler.run_job(_job(60)))
        await asyncio.sleep(0)  # let it enqueue
        second = asyncio.ensure_future(scheduler.run_job(_job(40)))  # 60 ahead: starts in time
        await asyncio.sleep(0)
        third = asyncio.ensure_future(scheduler.run_job(_job(1)))  # 100 ahead: starts at 1 s
        await asyncio.sleep(0)
        assert scheduler.depth().queued_tokens == 101
        with pytest.raises(ScorerOverloaded, match="101 tokens ahead, more than 1 s of work "
                           "at 100 tokens/s"):
            await scheduler.run_job(_job(1))
        assert scheduler.depth().queued_tokens == 101  # the refused job left nothing behind
        assert scheduler.refused_tokens == 1  # but its demand is counted for the autoscaler
        scheduler.start()
        results = await asyncio.wait_for(asyncio.gather(first, second, third), timeout=30)
        assert [len(r.results[0]) for r in results] == [1, 1, 1]

    try:
        asyncio.run(scenario())
    finally:
        scheduler.stop()


def test_job_larger_than_the_bound_gets_in_when_nothing_waits():
    scheduler = Scheduler(FakeEngine(), LIMITED, batch_token_budget=BUDGET,
                          capacity_tokens_per_s=RATE)
    scheduler.start()
    try:
        result = asyncio.run(scheduler.run_job(_job(150)))
        assert len(result.results) == 1
    finally:
        scheduler.stop()


def test_until_a_rate_is_measured_only_the_wait_refuses():
    scheduler = Scheduler(FakeEngine(), LIMITED, batch_token_budget=BUDGET)  # no probe's rate
    assert scheduler.throughput.tokens_per_s == 0.0 and scheduler.queue_bound_tokens() is None

    async def scenario():
        jobs = [asyncio.ensure_future(scheduler.run_job(_job(BUDGET))) for _ in range(3)]
        await asyncio.sleep(0)
        assert scheduler.depth().queued_tokens == 3 * BUDGET  # far past a bound: none refused
        for job in jobs:
            job.cancel()

    asyncio.run(scenario())


def test_the_rate_follows_full_batches_only():
    throughput = Throughput(tokens_per_s=0.0, full_batch_tokens=500)
    throughput.observe(100, 0.001)  # a small batch: launch-bound, it says nothing of capacity
    assert throughput.tokens_per_s == 0.0
    throughput.observe(1000, 1.0)
    assert throughput.tokens_per_s == 1000.0  # the first full batch sets it
    throughput.observe(1000, 0.5)  # then a moving average: THROUGHPUT_SMOOTHING of the newest
    assert throughput.tokens_per_s == pytest.approx(1000 + THROUGHPUT_SMOOTHING * 1000)


def test_the_loop_measures_its_batches():
    scheduler = Scheduler(FakeEngine(), LIMITED, batch_token_budget=BUDGET)
    scheduler.start()
    try:
        asyncio.run(scheduler.run_job(ScoreJob([pack_plain(list(range(3, 403)), 0)] * 2,
                                               LABELS)))  # 800 tokens: a full batch
        assert scheduler.throughput.tokens_per_s > 0
        assert scheduler.queue_bound_tokens() == int(scheduler.throughput.tokens_per_s)
    finally:
        scheduler.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_health_check_fails_once_the_loop_thread_died():
    worker = ScoreWorker.func_or_class.__new__(ScoreWorker.func_or_class)
    sequence = _job(5).sequences[0]
    # SystemExit passes the per-batch error handling: it kills the loop thread, as a bug would.
    dying = FakeEngine(poisoned=(sequence,), error=SystemExit("loop thread killed"))
    worker.scheduler = Scheduler(dying, LIMITED, batch_token_budget=BUDGET)
    worker.multiplexed = {}  # no other models loaded
    worker.scheduler.start()
    worker.check_health()  # alive and idle
    worker.scheduler.submit(ScoreTask(sequence, LABELS, lambda _: None))
    worker.scheduler._thread.join(timeout=10)
    with pytest.raises(RuntimeError, match="loop thread died"):
        worker.check_health()
    with pytest.raises(RuntimeError, match="loop thread died"):
        worker.ping()


def test_a_cpu_scorer_knows_its_rate_from_the_start(tiny_checkpoint, engine_for):
    """The CPU's start-up probe measures its throughput, so the load bound refuses from the first
    job on (there is no window where nothing is refused because no rate is known yet)."""
    from gpu_worker.forward.startup import measure_budget

    engine = engine_for(tiny_checkpoint("llama"))
    budget = measure_budget(engine, max_batch_tokens=BUDGET, min_batch_tokens=400)
    assert budget.tokens == BUDGET and budget.capacity_tokens_per_s > 0
    scheduler = Scheduler(FakeEngine(), LIMITED, batch_token_budget=BUDGET,
                          capacity_tokens_per_s=budget.capacity_tokens_per_s)
    bound = scheduler.queue_bound_tokens()
    assert bound == int(budget.capacity_tokens_per_s * LIMITED.max_queue_wait_s)

    async def scenario():  # the loop is not started: what is submitted stays queued
        first = asyncio.ensure_future(scheduler.run_job(_job(bound + 1)))
        await asyncio.sleep(0)
        with pytest.raises(ScorerOverloaded):
            await scheduler.run_job(_job(10))
        first.cancel()

    asyncio.run(scenario())


def test_a_cancelled_jobs_queued_work_stops_counting_at_once():
    """A job whose caller went away while it waited behind a running batch no longer counts as
    work ahead: a new job is admitted at once (its 200 tokens ahead would be refused, the bound
    being 100), and the abandoned one is dropped unscored at the loop's next pick."""
    fake = FakeEngine()
    fake.hold()  # the first batch stays on the "device" until released
    scheduler = Scheduler(fake, LIMITED, batch_token_budget=BUDGET, capacity_tokens_per_s=RATE)
    assert scheduler.queue_bound_tokens() == 100
    scheduler.start()

    async def scenario():
        running = asyncio.ensure_future(scheduler.run_job(_job(50)))
        for _ in range(3000):  # until the loop waits on the held batch
            if fake.finishing.is_set():
                break
            await asyncio.sleep(0.01)
        abandoned = asyncio.ensure_future(scheduler.run_job(_job(200)))
        await asyncio.sleep(0)
        assert scheduler.depth().queued_tokens == 200
        abandoned.cancel()
        with pytest.raises(asyncio.CancelledError):
            await abandoned
        assert scheduler.depth().queued_tokens == 0
        admitted = asyncio.ensure_future(scheduler.run_job(_job(10)))
        await asyncio.sleep(0)
        fake.release()
        return await running, await admitted

    try:
        first, admitted = asyncio.run(scenario())
    finally:
        scheduler.stop()
    assert len(first.results) == len(admitted.results) == 1
    assert len(fake.batches) == 2  # the running job's and the admitted one's: never the other
    assert scheduler.cancelled_dropped == 1
    assert scheduler.depth() == QueueDepth(0, 0, 0, 0)
