"""Admission control and health of a scorer replica, without Serve, on a fake engine
(tests/cpu/fake_engine.py): admission and health do not depend on what the engine computes."""

import asyncio

import pytest

from gpu_worker.deployment import ScoreWorker
from gpu_worker.scheduler import Scheduler, ScoreTask
from ranker_contract.config import SchedulerConfig
from ranker_contract.errors import ScorerOverloaded
from ranker_contract.packing import ScoreJob, pack_plain
from tests.cpu.fake_engine import FakeEngine

LABELS = [0, 5]
LIMITED = SchedulerConfig(max_batch_sequences=8, max_queued_tokens=100)
BUDGET = 1000  # tokens per batch


def _job(tokens: int) -> ScoreJob:
    return ScoreJob([pack_plain(list(range(3, 3 + tokens)), 0)], LABELS)


def test_job_past_the_queued_token_limit_is_refused_without_queueing():
    # The loop is not started, so everything submitted stays queued.
    scheduler = Scheduler(FakeEngine(), LIMITED, batch_token_budget=BUDGET)

    async def scenario():
        first = asyncio.ensure_future(scheduler.run_job(_job(60)))
        await asyncio.sleep(0)  # let it enqueue
        assert scheduler.depth().queued_tokens == 60
        with pytest.raises(ScorerOverloaded, match="60 tokens already queued"):
            await scheduler.run_job(_job(41))
        assert scheduler.depth().queued_tokens == 60  # the refused job left nothing behind
        assert scheduler.refused_tokens == 41  # but its demand is counted for the autoscaler
        second = asyncio.ensure_future(scheduler.run_job(_job(40)))
        await asyncio.sleep(0)
        assert scheduler.depth().queued_tokens == 100  # exactly at the limit is accepted
        scheduler.start()
        results = await asyncio.wait_for(asyncio.gather(first, second), timeout=30)
        assert [len(r.results[0]) for r in results] == [1, 1]

    try:
        asyncio.run(scenario())
    finally:
        scheduler.stop()


def test_job_larger_than_the_limit_gets_in_when_nothing_waits():
    scheduler = Scheduler(FakeEngine(), LIMITED, batch_token_budget=BUDGET)
    scheduler.start()
    try:
        result = asyncio.run(scheduler.run_job(_job(150)))
        assert len(result.results) == 1
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
