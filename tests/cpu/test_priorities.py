"""Priority classes in the scheduling loop, on a fake engine (tests/cpu/fake_engine.py): online
work is batched ahead of bulk work, bulk keeps a floor share of each batch while it waits (it
is never starved), bulk is refused first by the queue-wait bound, and the key file names a
key's class. Tasks are submitted before start(): the loop composes the same batches every run.
"""

import asyncio

import pytest

from gpu_worker.serving.scheduler import Scheduler, ScoreTask
from ranker_contract.config import SchedulerConfig
from ranker_contract.errors import ScorerOverloaded
from ranker_contract.packing import ScoreJob, pack_plain
from serve_app.auth import parse_keys
from tests.cpu.fake_engine import FakeEngine
from tests.cpu.test_scheduler import Collector

LABELS = [0, 5]
BUDGET = 1000  # tokens per batch


def _sequence(tokens: int):
    sequence = pack_plain(list(range(3, 3 + tokens)), 0)
    assert sequence.num_tokens == tokens
    return sequence


def _loop(**options) -> Scheduler:
    """A loop on a synchronous fake engine (each batch finished as it is launched)."""
    return Scheduler(FakeEngine(asynchronous=False),
                     SchedulerConfig(max_batch_sequences=64, **options), batch_token_budget=BUDGET)


def _run(scheduler: Scheduler, tasks: list[tuple[int, bool]]) -> list[list[int]]:
    """Submit (tokens, bulk) tasks before start, wait for all; the ids of each batch's tasks in
    submission order (0, 1, ...)."""
    collector = Collector()
    sequences = [_sequence(tokens) for tokens, _ in tasks]
    for i, ((_, bulk), seq) in enumerate(zip(tasks, sequences, strict=True)):
        scheduler.submit(ScoreTask(seq, LABELS, collector.callback(i), bulk=bulk))
    scheduler.start()
    try:
        collector.wait(len(tasks))
    finally:
        scheduler.stop()
    index = {id(seq): i for i, seq in enumerate(sequences)}
    return [[index[s] for s in batch] for batch in scheduler.engine.batches]


def test_online_work_goes_first_and_bulk_keeps_its_floor_share():
    # 30 bulk tasks of 100 tokens were queued first, then 30 online ones of 100: with a floor
    # of 0.2, every batch of 1,000 tokens holds 2 bulk tasks and 8 online ones while both wait.
    scheduler = _loop(bulk_floor_share=0.2)
    tasks = [(100, True)] * 30 + [(100, False)] * 30
    batches = _run(scheduler, tasks)
    bulk_ids = set(range(30))
    online_batches = [b for b in batches if set(b) - bulk_ids]
    assert len(online_batches) == 4  # 30 online tasks at 8 a batch (the last with 6)
    for batch in online_batches[:3]:
        assert sum(1 for i in batch if i in bulk_ids) == 2 and len(batch) == 10
    assert online_batches == batches[:4]  # online work is done in the first four batches
    # Bulk runs in its first-come order and in what online leaves: all of it, once.
    bulk_order = [i for b in batches for i in b if i in bulk_ids]
    assert bulk_order == sorted(bulk_order) and sorted(bulk_order) == list(range(30))


def test_without_bulk_waiting_online_fills_the_batch_and_with_a_zero_floor_bulk_waits():
    scheduler = _loop(bulk_floor_share=0.0)
    tasks = [(100, True)] * 5 + [(100, False)] * 15
    batches = _run(scheduler, tasks)
    assert batches[0] == list(range(5, 15))  # 10 online tasks, no bulk
    assert batches[1] == [*range(15, 20), *range(5)]  # the rest of online, then bulk


def test_an_online_task_larger_than_the_budget_still_runs_alone_beside_waiting_bulk():
    scheduler = _loop(bulk_floor_share=0.5)
    tasks = [(100, True)] * 20 + [(1500, False)]
    batches = _run(scheduler, tasks)
    assert [20] in batches  # alone, once bulk's share was deferred one batch
    assert sorted(i for b in batches for i in b) == list(range(21))


def test_bulk_is_refused_first_by_the_queue_bound():
    # A bound of 1 s at 100 tokens/s: 100 tokens may be ahead. 150 bulk tokens are queued: a
    # bulk job is refused, an online job counts only the online work ahead and gets in.
    scheduler = Scheduler(FakeEngine(), SchedulerConfig(max_batch_sequences=8,
                                                        max_queue_wait_s=1.0),
                          batch_token_budget=BUDGET, capacity_tokens_per_s=100.0)

    def job(tokens: int, bulk: bool) -> ScoreJob:
        return ScoreJob([_sequence(tokens)], LABELS, bulk=bulk)

    async def scenario():
        queued = asyncio.ensure_future(scheduler.run_job(job(150, True)))
        await asyncio.sleep(0)
        with pytest.raises(ScorerOverloaded, match="150 tokens ahead"):
            await scheduler.run_job(job(10, True))
        online = asyncio.ensure_future(scheduler.run_job(job(10, False)))
        await asyncio.sleep(0)
        assert scheduler.depth().queued_tokens == 160  # both admitted jobs wait
        scheduler.start()
        await asyncio.wait_for(asyncio.gather(queued, online), timeout=30)

    try:
        asyncio.run(scenario())
    finally:
        scheduler.stop()


def test_a_key_entry_names_its_priority_class():
    keys = parse_keys("etl:" + "e" * 16 + " priority=bulk tpm=100\nweb:" + "w" * 16
                      + " priority=online\napp:" + "a" * 16 + "\n", "src")
    assert keys["etl"].bulk and keys["etl"].quota.tokens_per_minute == 100
    assert not keys["web"].bulk and not keys["app"].bulk
    for bad in ("priority=urgent", "priority=bulk priority=bulk"):
        with pytest.raises(ValueError, match="priority must be given once"):
            parse_keys("etl:" + "e" * 16 + f" {bad}\n", "src")
