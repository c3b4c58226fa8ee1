"""Admission control and health of a scorer replica, without Serve."""

import asyncio

import pytest

from gpu_worker.deployment import ScoreWorker
from gpu_worker.engine import Engine, ScoreTask, Step
from gpu_worker.scheduler import Scheduler
from ranker_contract.config import SchedulerConfig
from ranker_contract.errors import ScorerOverloaded
from ranker_contract.packing import ScoreJob, pack_plain

LABELS = [0, 5]
LIMITED = SchedulerConfig(max_batch_tokens=1000, max_batch_sequences=8, max_queued_tokens=100)


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, engine_for) -> Engine:
    return engine_for(tiny_checkpoint("llama"))


def _job(tokens: int) -> ScoreJob:
    return ScoreJob([pack_plain(list(range(3, 3 + tokens)), 0)], LABELS)


def test_job_past_the_queued_token_limit_is_refused_without_queueing(engine):
    # The loop is not started, so everything submitted stays queued.
    scheduler = Scheduler(engine, LIMITED)

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


def test_job_larger_than_the_limit_gets_in_when_nothing_waits(engine):
    scheduler = Scheduler(engine, LIMITED)
    scheduler.start()
    try:
        result = asyncio.run(scheduler.run_job(_job(150)))
        assert len(result.results) == 1
    finally:
        scheduler.stop()


class _DyingEngine(Engine):
    """Kills the loop thread the way a bug outside the per-batch error handling would."""

    def launch(self, tasks: list[ScoreTask], *, overlapped: bool = False) -> Step:
        raise SystemExit("loop thread killed")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_health_check_fails_once_the_loop_thread_died(engine):
    worker = ScoreWorker.func_or_class.__new__(ScoreWorker.func_or_class)
    worker.scheduler = Scheduler(_DyingEngine(engine.model, engine.device), LIMITED)
    worker.scheduler.start()
    worker.check_health()  # alive and idle
    worker.scheduler.submit(ScoreTask(_job(5).sequences[0], LABELS, lambda _: None))
    worker.scheduler._thread.join(timeout=10)
    with pytest.raises(RuntimeError, match="loop thread died"):
        worker.check_health()
    with pytest.raises(RuntimeError, match="loop thread died"):
        worker.ping()
