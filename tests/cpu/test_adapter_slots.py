"""Adapters loaded on first use into a fixed number of slots (gpu_worker/serving/adapter_slots.py),
on the scheduling loop and its fake engine: the least recently used idle adapter is unloaded, one
with tasks queued or running never is, other traffic runs while an adapter is read, and a read
that fails fails that adapter's tasks only. The fake engine records the slot each batch's rows
name; `put` records what went into which slot."""

from __future__ import annotations

import queue
import threading

import pytest

from gpu_worker.serving.adapter_slots import AdapterSlots
from gpu_worker.serving.scheduler import Scheduler, ScoreTask
from ranker_contract.config import SchedulerConfig
from tests.cpu.fake_engine import FakeEngine, fake_scores
from tests.cpu.sequences import mixed_sequences

TIMEOUT_S = 30.0
LABELS = [0, 5]


class Source:
    """What the loop reads and puts: read(adapter) returns a name for it, after `gate` opens
    for adapters in `held`; adapters in `broken` fail to read."""

    def __init__(self, held=(), broken=()) -> None:
        self.held, self.broken = set(held), set(broken)
        self.gate = threading.Event()
        self.reads: list[int] = []
        self.reading = threading.Event()  # set once a held read has begun
        self.puts: list[tuple[int, str]] = []

    def read(self, adapter: int) -> str:
        self.reads.append(adapter)
        if adapter in self.held:
            self.reading.set()
            assert self.gate.wait(TIMEOUT_S), "the test never opened the gate"
        if adapter in self.broken:
            raise OSError(f"adapter {adapter}: no such file")
        return f"adapter-{adapter}"

    def put(self, slot: int, read: str) -> None:
        self.puts.append((slot, read))


class Results:
    def __init__(self) -> None:
        self.done: queue.Queue = queue.Queue()

    def task(self, name, sequence, adapter: int) -> ScoreTask:
        return ScoreTask(sequence, LABELS, lambda result: self.done.put((name, result)),
                         adapter=adapter)

    def wait(self, n: int) -> dict:
        return dict(self.done.get(timeout=TIMEOUT_S) for _ in range(n))


@pytest.fixture(scope="module")
def sequences():
    return mixed_sequences()


def started(engine, slots: AdapterSlots) -> Scheduler:
    loop = Scheduler(engine, SchedulerConfig(max_batch_sequences=8), batch_token_budget=10_000,
                     adapters=slots)
    loop.start()
    return loop


def slot_of_each_row(fake: FakeEngine, sequences) -> dict[int, int]:
    """id(sequence) -> the slot its row named, over every launch."""
    return {seq_id: slot for batch, slots in zip(fake.batches, fake.adapters)
            for seq_id, slot in zip(batch, slots or [0] * len(batch))}


def test_first_use_loads_into_the_least_recently_used_idle_slot_while_others_run(sequences):
    source = Source(held={3})
    slots = AdapterSlots(3, 2, {1: 1, 2: 2}, source.read, source.put)
    fake, results = FakeEngine(), Results()
    loop = started(fake, slots)
    try:
        loop.submit(results.task("two", sequences[0], 2))
        assert results.wait(1)["two"] == fake_scores(sequences[0], LABELS)
        loop.submit(results.task("one", sequences[1], 1))  # now adapter 2 is the older
        results.wait(1)
        loop.submit(results.task("three", sequences[2], 3))
        assert source.reading.wait(TIMEOUT_S)
        # while adapter 3 is read, the model and the loaded adapters keep running
        loop.submit(results.task("base", sequences[3], 0), results.task("one again",
                                                                         sequences[4], 1))
        assert set(results.wait(2)) == {"base", "one again"}
        assert source.puts == [] and results.done.empty()
        source.gate.set()
        assert results.wait(1)["three"] == fake_scores(sequences[2], LABELS)
    finally:
        loop.stop()
    assert source.reads == [3] and source.puts == [(2, "adapter-3")]
    assert slot_of_each_row(fake, sequences)[id(sequences[2])] == 2
    assert slots.slot_of == {1: 1, 3: 2}
    assert (slots.loads, slots.unloads) == ([0, 0, 0, 1], [0, 0, 1, 0])


def test_an_adapter_with_tasks_running_is_never_unloaded(sequences):
    source = Source()
    slots = AdapterSlots(2, 1, {1: 1}, source.read, source.put)
    fake, results = FakeEngine(), Results()
    fake.hold()  # adapter 1's batch stays on the "device"
    loop = started(fake, slots)
    try:
        loop.submit(results.task("one", sequences[0], 1))
        assert fake.finishing.wait(TIMEOUT_S)
        loop.submit(results.task("two", sequences[1], 2))
        loop.submit(results.task("one, later", sequences[2], 1))
        # adapter 2 waits for the only slot: its tasks, not adapter 1's, are held back
        fake.release()
        got = results.wait(3)
    finally:
        loop.stop()
    assert set(got) == {"one", "two", "one, later"}
    rows = slot_of_each_row(fake, sequences)
    assert rows[id(sequences[0])] == rows[id(sequences[2])] == rows[id(sequences[1])] == 1
    # adapter 1's second task ran before adapter 2 took its slot
    order = [seq_id for batch in fake.batches for seq_id in batch]
    assert order.index(id(sequences[2])) < order.index(id(sequences[1]))
    assert source.puts == [(1, "adapter-2")]
    assert slots.slot_of == {2: 1}


def test_a_read_that_fails_fails_that_adapters_tasks_only_and_is_tried_again(sequences):
    source = Source(broken={2})
    slots = AdapterSlots(2, 2, {1: 1}, source.read, source.put)
    fake, results = FakeEngine(), Results()
    loop = started(fake, slots)
    try:
        loop.submit(results.task("two", sequences[0], 2), results.task("one", sequences[1], 1))
        got = results.wait(2)
        assert isinstance(got["two"], OSError) and "no such file" in str(got["two"])
        assert got["one"] == fake_scores(sequences[1], LABELS)
        source.broken.clear()
        loop.submit(results.task("two again", sequences[2], 2))
        assert results.wait(1)["two again"] == fake_scores(sequences[2], LABELS)
    finally:
        loop.stop()
    assert source.reads == [2, 2] and source.puts == [(2, "adapter-2")]
    assert loop.depth().queued_sequences == 0
