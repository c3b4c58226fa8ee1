"""`two_streams` (gpu_worker/engine.py): a large eager batch split into two halves on two CUDA
streams gives the scores of the whole batch on one stream, in task order, without a host sync."""

import random

import pytest

from gpu_worker.engine import MIN_SPLIT_TOKENS, Engine, ScoreTask
from ranker_contract.config import EngineConfig
from ranker_contract.packing import pack_multi_item, pack_plain
from tests.gpu.conftest import (LABELS, launch_checking_no_host_sync, run_batch, scheduled,
                                worst_difference)

VOCAB = 151643


@pytest.fixture(scope="module")
def split_engine(fast_engine):
    return Engine(fast_engine.model, fast_engine.device, EngineConfig(
        device="cuda", dtype="bfloat16", attention="flashinfer", ops="cuda", two_streams=True))


def _ids(rng, n):
    return [rng.randrange(VOCAB) for _ in range(n)]


def _mixed_batch(rng):
    """Multi-item requests of varied shapes (empty items included) and plain sequences, ~15k
    tokens in all."""
    sequences = []
    for k in range(8):
        lens = [rng.choice((1, 0, 40, 180, 300)) for _ in range(rng.randrange(1, 12))]
        sequences.append(pack_multi_item(_ids(rng, rng.choice((20, 120))),
                                         [_ids(rng, n) for n in lens], 0))
        sequences.append(pack_plain(_ids(rng, 50 + 97 * k), 0))
    return sequences + [pack_multi_item(_ids(rng, 120), [_ids(rng, 180)] * 40, 0)]


def test_the_halves_give_the_whole_batchs_scores(fast_engine, split_engine):
    sequences = _mixed_batch(random.Random(21))
    tasks = [ScoreTask(s, LABELS, lambda _: None) for s in sequences]
    first, second = split_engine._split(tasks)
    assert first and second and first + second == tasks  # it splits, in order
    assert sum(s.num_tokens for s in sequences) >= MIN_SPLIT_TOKENS
    # The halves' GEMMs have other row counts than the whole batch's, so cuBLAS may sum in
    # another order: the bounds of the graph-vs-eager test, not bitwise.
    lp, p = worst_difference(run_batch(split_engine, sequences), run_batch(fast_engine, sequences))
    print(f"two streams vs one: max |Δ logprob| {lp:.2e}, max |Δ softmax| {p:.2e}")
    assert lp <= 5e-2 and p <= 5e-3


def test_small_batches_stay_whole(split_engine):
    rng = random.Random(22)
    tasks = [ScoreTask(pack_multi_item(_ids(rng, 120), [_ids(rng, 180)] * 5, 0), LABELS,
                       lambda _: None) for _ in range(4)]  # ~4k tokens
    assert split_engine._split(tasks) is None


def test_two_stream_launch_has_no_host_sync(split_engine):
    tasks = [ScoreTask(s, LABELS, lambda _: None) for s in _mixed_batch(random.Random(23))]
    step = launch_checking_no_host_sync(split_engine, tasks)
    assert [len(r) for r in split_engine.finish(step)] == [t.sequence.num_items for t in tasks]


def test_overlap_loop_with_two_streams_equals_sync(fast_engine, split_engine):
    """Batch N+1's halves are queued while batch N's still run on the same two streams."""
    rng = random.Random(24)
    sequences = [pack_multi_item(_ids(rng, 120), [_ids(rng, 180)] * 10, 0) for _ in range(24)]
    one_stream = scheduled(fast_engine, sequences, False, max_batch_tokens=16384)
    for overlap in (True, False):
        lp, p = worst_difference(
            scheduled(split_engine, sequences, overlap, max_batch_tokens=16384), one_stream)
        print(f"overlap={overlap}: two streams vs one max |Δ logprob| {lp:.2e}, softmax {p:.2e}")
        assert lp <= 5e-2 and p <= 5e-3
