"""Deterministic scores (docs/ARCHITECTURE.md, "Deterministic scores"): 1,000 random (query,
item) pairs, each scored alone as the reference (a CUDA graph replay), then in other
compositions (requests of 1 to 500 items, several sequences, other requests beside, graphs and
eager, a prefix-cache miss and hits); every label log-prob must equal its lone one bit for bit,
bf16 and FP8.

Queries and items of 32 to 300 tokens, the lengths the guarantee covers; how far shorter ones
move a score is measured by loadtest/batch_invariance.py (a partial prefix-cache hit, also
outside it, is bounded on the CPU by tests/cpu/test_prefix_cache.py)."""

import random

import pytest

from gpu_worker.engine import Engine
from ranker_contract.config import EngineConfig
from tests.gpu.conftest import LABELS, ids
from tests.support.compositions import pack, score_batch

ITEMS_PER_QUERY = [500, 100, 100, 100, 100, 100]  # 1,000 pairs


def score_requests(engine, batches, eager=False):
    """{pair key: label log-probs} of every batch of `batches` (score_batch)."""
    return {key: row for batch in batches
            for key, row in score_batch(engine, batch, LABELS, eager).items()}


@pytest.fixture(scope="module", params=["bf16", "fp8"])
def engine(request, qwen3_path):
    cfg = EngineConfig(device="cuda", precision=request.param, cuda_graphs={"enabled": True})
    assert cfg.deterministic  # the shipped default
    return Engine.from_config(qwen3_path, cfg)


def with_prefix_cache(engine):
    """The same model (bf16 or FP8 linears) on an engine that keeps every query of 32 tokens
    or more."""
    return Engine(engine.model, engine.device, EngineConfig(device="cuda", prefix_cache={
        "tokens": 1 << 16, "min_tokens": 32, "min_query_share": 0.0}))


def test_a_score_does_not_depend_on_its_batch(engine):
    rng = random.Random(53)
    queries = [ids(rng, rng.randint(32, 200)) for _ in ITEMS_PER_QUERY]
    items = {(q, i): ids(rng, rng.randint(32, 300))
             for q, n in enumerate(ITEMS_PER_QUERY) for i in range(n)}
    by_query = [[(q, i) for i in range(n)] for q, n in enumerate(ITEMS_PER_QUERY)]

    def request(keys):
        return keys, pack(queries[keys[0][0]], [items[k] for k in keys])

    alone = [[request([key])] for key in items]
    lone = score_requests(engine, alone)
    assert all(engine.graphs.pick(seqs, 1, len(LABELS)) for [(_, seqs)] in alone)

    # each query's items in one request (500 or 100), split over sequences of 4,096 tokens
    whole = [[(keys, pack(queries[keys[0][0]], [items[k] for k in keys], max_seq_tokens=4096))]
             for keys in (rng.sample(q_keys, len(q_keys)) for q_keys in by_query)]
    # every query's items shuffled into requests of 1 to 40, shuffled into batches of 1 to 6
    requests = []
    for q_keys in by_query:
        keys = rng.sample(q_keys, len(q_keys))
        while keys:
            n = rng.randint(1, 40)
            requests.append(request(keys[:n]))
            keys = keys[n:]
    rng.shuffle(requests)
    mixed, at = [], 0
    while at < len(requests):
        n = rng.randint(1, 6)
        mixed.append(requests[at:at + n])
        at += n

    def fits_a_graph(batch):
        n = sum(len(keys) for keys, _ in batch)
        return engine.graphs.pick([s for _, seqs in batch for s in seqs], n,
                                  n * len(LABELS)) is not None

    graphs_used = sum(map(fits_a_graph, mixed))
    assert 0 < graphs_used < len(mixed)  # both paths in the mixed run

    # on an engine with the prefix cache: each query's first request a miss, the rest hits
    cached = with_prefix_cache(engine)
    from_cache = score_requests(cached, [[r] for r in requests])
    stats, sequences = cached.prefix_cache.stats, sum(len(seqs) for _, seqs in requests)
    assert (stats.misses, stats.hits, stats.partial_hits) == (len(by_query),
                                                              sequences - len(by_query), 0)

    compositions = {
        "alone, eager": score_requests(engine, alone, eager=True),
        "each query's 500 or 100 items in one request, several sequences":
            score_requests(engine, whole),
        "mixed requests and batches, graphs where they fit": score_requests(engine, mixed),
        "the same batches, eager": score_requests(engine, mixed, eager=True),
        "the same requests, a prefix-cache miss then hits": from_cache,
    }
    differ = {}
    for name, got in compositions.items():
        assert got.keys() == lone.keys(), name
        deltas = [max(abs(a - b) for a, b in zip(got[k], lone[k])) for k in lone]
        differ[name] = (sum(d > 0 for d in deltas), max(deltas))
        print(f"{name}: {differ[name][0]} of {len(deltas)} pairs differ, max |Δ| "
              f"{differ[name][1]:.3g}")
    assert all(n == 0 for n, _ in differ.values()), differ
