"""The prefix cache with FlashInfer (bf16, CUDA ops): a hit scores what the same request scores
without a cache, eagerly and on an engine with CUDA graphs (where a batch with a cacheable
query runs eagerly through the cache, idle or not, and only one without replays a graph), in one
batch with its own miss, through the overlapped scheduling loop, with no host sync on the launch
path, and under eviction."""

import dataclasses
import random

import pytest

from gpu_worker.forward.engine import Engine
from ranker_contract.config import EngineConfig
from ranker_contract.packing import pack_request
from tests.gpu.conftest import (
    VOCAB,
    launch_checking_no_host_sync,
    run_batch,
    scheduled,
    worst_difference,
)

# A hit computes its items in other batch shapes than the miss did (other GEMM tiles, other
# attention splits; bf16): the multi-item vs one-at-a-time bounds of test_gpu_engine.py.
BOUNDS = (5e-2, 5e-3)  # max |Δ log-prob|, max |Δ softmax score|


def cached_engine(fast_engine, tokens=65536, graphs=False) -> Engine:
    return Engine(fast_engine.model, fast_engine.device, EngineConfig(
        device="cuda", cuda_graphs={"enabled": graphs}, prefix_cache={
            "tokens": tokens, "min_tokens": 64, "min_query_share": 0.0}))  # pages: exactness


def request(rng, query, items, item_len, max_seq_tokens=16384):
    return pack_request(query, [[rng.randrange(VOCAB) for _ in range(item_len)]
                                for _ in range(items)],
                        item_first=False, delimiter_id=0, max_seq_tokens=max_seq_tokens,
                        max_context=1 << 20)


def query(rng, n):
    return [rng.randrange(VOCAB) for _ in range(n)]


def within(got, want, what):
    lp, p = worst_difference(got, want)
    print(f"{what}: max |Δ logprob| {lp:.2e}, max |Δ softmax| {p:.2e}")
    assert lp <= BOUNDS[0] and p <= BOUNDS[1], what


def eagerly(engine, sequences):
    """Launched eagerly, as a batch too large for a CUDA graph runs."""
    return run_batch(engine, sequences, eager=True)


@pytest.fixture(scope="module")
def graph_cached_engine(fast_engine):
    return cached_engine(fast_engine, graphs=True)


def test_hits_score_what_no_cache_scores_eager_and_with_graphs(fast_engine, graph_cached_engine):
    rng = random.Random(0)
    for graphs, engine in ((False, cached_engine(fast_engine)), (True, graph_cached_engine)):
        for name, (q, items, item_len) in {"profile": (2000, 20, 50), "pages": (120, 10, 180),
                                           "one item": (300, 1, 40)}.items():
            shared = query(rng, q)
            miss, hit = request(rng, shared, items, item_len), request(rng, shared, items,
                                                                        item_len)
            within(eagerly(engine, miss), run_batch(fast_engine, miss), f"{name} miss")
            before = engine.prefix_cache.stats.hits
            within(eagerly(engine, hit), run_batch(fast_engine, hit),
                   f"{name} hit, graphs {graphs}")
            assert engine.prefix_cache.stats.hits == before + len(hit)
            if graphs:  # idle and fitting a graph, a cacheable batch still hits the cache
                assert engine.graphs.pick(hit, items, 2 * items) is not None
                within(run_batch(engine, hit), run_batch(fast_engine, hit), f"{name} idle")
                assert engine.prefix_cache.stats.hits == before + 2 * len(hit)


def test_a_batch_without_a_cacheable_query_replays_its_graph(fast_engine, graph_cached_engine):
    engine = graph_cached_engine
    looked_up = dataclasses.astuple(engine.prefix_cache.stats)
    rng = random.Random(4)
    short = request(rng, query(rng, 63), 10, 180)  # below prefix_cache_min_tokens
    assert engine.graphs.pick(short, 10, 20) is not None
    replays, replay = [], engine.graphs.launch
    engine.graphs.launch = lambda *args, **kw: replays.append(1) or replay(*args, **kw)
    within(run_batch(engine, short), run_batch(fast_engine, short), "short query, idle")
    assert replays == [1]
    assert dataclasses.astuple(engine.prefix_cache.stats) == looked_up


def test_one_batch_fills_and_reads_an_entry_and_splits_share_it(fast_engine):
    engine = cached_engine(fast_engine)
    rng = random.Random(1)
    shared = query(rng, 1500)
    # One request split into three sequences (max_seq_tokens), then two more with the query:
    # the first sequence inserts, every other one hits, all in one batch.
    batch = (request(rng, shared, 30, 100, max_seq_tokens=3000)
             + request(rng, shared, 5, 60) + request(rng, query(rng, 500), 3, 80))
    within(run_batch(engine, batch), run_batch(fast_engine, batch), "fill and read")
    stats = engine.prefix_cache.stats
    assert stats.misses == 2 and stats.hits == len(batch) - 2


def test_the_overlapped_loop_with_hits_matches_the_synchronous_engine(fast_engine):
    engine = cached_engine(fast_engine, tokens=8192)  # four 2,000-token queries: evictions
    rng = random.Random(2)
    queries = [query(rng, 2000) for _ in range(6)]
    sequences = [s for _ in range(24) for s in request(rng, rng.choice(queries), 20, 50)]
    got = scheduled(engine, sequences, overlap=True, batch_token_budget=12000)
    want = [run_batch(fast_engine, [s])[0] for s in sequences]
    within(got, want, "overlapped loop, tiny pool")
    stats = engine.prefix_cache.stats
    assert stats.hits > 0 and stats.evictions > 0


def test_no_host_sync_when_launching_a_hit(fast_engine):
    engine = cached_engine(fast_engine)
    rng = random.Random(3)
    shared = query(rng, 1000)
    run_batch(engine, request(rng, shared, 10, 50))  # inserted
    step = launch_checking_no_host_sync(engine, request(rng, shared, 10, 50))
    engine.finish(step)
    assert engine.prefix_cache.stats.hits >= 2
