"""The query-prefix K/V cache (gpu_worker/attention/prefix_cache.py) on CPU: a hit scores what a
miss does bit for bit, a partial hit within the multi-item bound, a batch both fills and reads
pages, eviction under a tiny pool never fails or corrupts a request, and the counters say what
happened. The reference is the same checkpoint's engine without a cache (itself checked against
HF in test_engine_parity.py).
"""

from __future__ import annotations

import random

import pytest
import torch

from gpu_worker.attention.prefix_cache import kv_pair
from gpu_worker.forward.engine import Engine
from ranker_contract.config import EngineConfig
from ranker_contract.packing import PackedSequence, pack_multi_item, pack_plain, prefix_key

LABELS = [3, 17, 100]
# A hit computes its rows as the miss did, bit for bit (docs/ARCHITECTURE.md, "Deterministic
# scores"): every block sees the same keys in the same order, and the CPU's linears compute a row
# the same way whatever the batch. A partial hit computes the query rows left in a block of
# fewer rows (SDPA and the linears may then take another path): the multi-item vs
# one-at-a-time bound of test_multi_item.py.
PARTIAL_TOL = 1e-5
MIN_TOKENS = 8
PAGE = 16


def toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(2, 512) for _ in range(n)]


def request(rng: random.Random, query: list[int], items: int = 3) -> PackedSequence:
    return pack_multi_item(query, [toks(rng, rng.randrange(1, 9)) for _ in range(items)], 1)


@pytest.fixture(scope="module", params=["qwen3", "llama"])  # q/k-norm and not
def engines(request, tiny_checkpoint):
    path = tiny_checkpoint(request.param)

    def cached(capacity: int) -> Engine:
        return Engine.from_config(path, EngineConfig(prefix_cache={
            "tokens": capacity, "min_tokens": MIN_TOKENS, "page_tokens": PAGE}))
    return cached, Engine.from_config(path, EngineConfig())


def score(engine: Engine, sequences: list[PackedSequence]) -> list[list[list[float]]]:
    return engine.finish(engine.launch(sequences, [LABELS] * len(sequences)))


def assert_same(got, want, what: str, tol: float = 0.0) -> None:
    flat_got = [x for seq in got for row in seq for x in row]
    flat_want = [x for seq in want for row in seq for x in row]
    assert len(flat_got) == len(flat_want), what
    diff = max(abs(a - b) for a, b in zip(flat_got, flat_want, strict=True))
    assert diff <= tol, f"{what}: max |Δ logprob| = {diff:.2e}"


def test_a_hit_scores_what_a_miss_does(engines):
    make, reference = engines
    engine = make(4096)
    rng = random.Random(1)
    query = toks(rng, 30)
    first, again = request(rng, query), request(rng, query, items=4)
    assert_same(score(engine, [first]), score(reference, [first]), "miss")
    assert (engine.prefix_cache.stats.misses, engine.prefix_cache.stats.hits) == (1, 0)
    assert_same(score(engine, [again]), score(reference, [again]), "hit")
    stats = engine.prefix_cache.stats
    assert (stats.misses, stats.hits, stats.tokens_reused) == (1, 1, 30)
    assert stats.cached_tokens == 30


def test_a_tenant_never_hits_another_tenants_query(engines):
    """Per-key isolation (ScoreJob.cache_owner): the same query from another tenant is a miss,
    computed and kept apart, in its own batch or beside the owner's; each tenant then hits its
    own, and every score is the uncached engine's."""
    make, reference = engines
    engine = make(4096)
    rng = random.Random(9)
    query = toks(rng, 30)
    stats = engine.prefix_cache.stats

    def scored(owners: list[str], sequences: list[PackedSequence]) -> None:
        got = engine.finish(engine.launch(sequences, [LABELS] * len(sequences),
                                          cache_owners=owners))
        assert_same(got, score(reference, sequences), f"owners {owners}")

    scored(["key a"], [request(rng, query)])
    scored(["key b"], [request(rng, query)])
    assert (stats.misses, stats.hits) == (2, 0)  # b computed a's query anew
    scored(["key a", "group c", "key b"], [request(rng, query) for _ in range(3)])
    assert (stats.misses, stats.hits) == (3, 2)  # a and b their own; c's first is a miss
    scored([""], [request(rng, query)])  # auth off: one tenant of its own
    assert (stats.misses, stats.hits) == (4, 2)
    assert stats.cached_tokens == 4 * 30


def test_one_batch_fills_and_reads_an_entry_among_other_sequences(engines):
    make, reference = engines
    engine = make(4096)
    rng = random.Random(2)
    query = toks(rng, 25)
    batch = [pack_plain(toks(rng, 12), 0), request(rng, query), request(rng, toks(rng, 4)),
             request(rng, query, items=1), request(rng, query, items=5)]
    assert_same(score(engine, batch), score(reference, batch), "batch")
    stats = engine.prefix_cache.stats
    # The plain sequence and the 4-token query are below MIN_TOKENS: neither looked up.
    assert (stats.misses, stats.hits, stats.partial_hits, stats.bypasses) == (1, 2, 0, 0)


def test_the_plan_keeps_the_batch_order_and_cuts_the_cached_rows(engines):
    make, _ = engines
    engine = make(4096)
    rng = random.Random(12)
    cached = toks(rng, 20)
    score(engine, [request(rng, cached)])
    batch = [request(rng, toks(rng, 20)), pack_plain(toks(rng, 5), 0), request(rng, cached),
             request(rng, toks(rng, 30)), request(rng, cached, items=2)]
    plan = engine.prefix_cache.plan(batch)
    assert [len(s) if s is not None else None for s in plan.cached_slots] == [None, None, 20,
                                                                              None, 20]
    assert plan.cached_slots[2] == plan.cached_slots[4]  # one query's pages
    for i in (2, 4):  # without their query rows
        assert plan.sequences[i].num_tokens == batch[i].num_tokens - 20
        assert plan.sequences[i].input_ids == batch[i].input_ids[20:]
    assert [plan.sequences[i] for i in (0, 1, 3)] == [batch[0], batch[1], batch[3]]
    # The two misses' query rows are inserted: rows of the batch as run.
    third = sum(s.num_tokens for s in plan.sequences[:3])
    assert plan.insert_rows == list(range(20)) + list(range(third, third + 30))


def test_clear_empties_the_pool_and_zeroes_the_counters(engines):
    make, reference = engines
    engine = make(4096)
    rng = random.Random(13)
    query = toks(rng, 30)
    stats = engine.prefix_cache.stats  # the metrics thread holds this object
    score(engine, [request(rng, query)] * 2)
    assert stats.hits == 1 and stats.cached_tokens == 30
    engine.prefix_cache.clear()
    assert (stats.hits, stats.misses, stats.cached_tokens) == (0, 0, 0)
    again = request(rng, query)
    assert_same(score(engine, [again]), score(reference, [again]), "after clear")
    assert (stats.hits, stats.misses) == (0, 1)


def test_a_query_under_its_share_of_the_sequence_is_computed_and_not_routed(engines):
    """Reading the pool costs every item row a second attention pass: a query under
    prefix_cache_min_query_share (0.2 by default) of its sequence is computed, never looked up,
    and the ingress gives it no routing key."""
    make, reference = engines
    engine = make(4096)
    rng = random.Random(14)
    query = toks(rng, 10)
    many = pack_multi_item(query, [toks(rng, 8) for _ in range(8)], 1)  # 10 of 83 tokens
    few = pack_multi_item(query, [toks(rng, 8) for _ in range(2)], 1)  # 10 of 29 tokens
    share = EngineConfig().prefix_cache.min_query_share
    assert 10 / many.num_tokens < share <= 10 / few.num_tokens
    for _ in range(2):
        assert_same(score(engine, [many]), score(reference, [many]), "under the share")
    stats = engine.prefix_cache.stats
    assert sum(stats.lookups().values()) == 0 and stats.cached_tokens == 0
    for _ in range(2):
        assert_same(score(engine, [few]), score(reference, [few]), "over the share")
    assert (stats.misses, stats.hits) == (1, 1)
    assert prefix_key([many], MIN_TOKENS, share) is None
    assert prefix_key([few], MIN_TOKENS, share) == prefix_key([few], MIN_TOKENS, 0.0) is not None


def test_an_empty_item_is_scored_without_the_cache(engines):
    make, reference = engines
    engine = make(4096)
    rng = random.Random(3)
    query = toks(rng, 20)
    score(engine, [request(rng, query)])  # cached now
    with_empty = pack_multi_item(query, [toks(rng, 5), [], toks(rng, 3)], 1)
    assert_same(score(engine, [with_empty]), score(reference, [with_empty]), "empty item")
    assert engine.prefix_cache.stats.hits == 0  # it scores at a query row: computed whole


def test_eviction_in_a_tiny_pool_never_fails_or_corrupts(engines):
    make, reference = engines
    engine = make(100)  # two 40-token queries (pages of 16, 16 and 8 tokens) at most
    rng = random.Random(4)
    queries = [toks(rng, 40) for _ in range(5)] + [toks(rng, 120)]  # the last never fits
    looked_up = 0
    for round_ in range(12):
        batch = [request(rng, rng.choice(queries)) for _ in range(rng.randrange(1, 4))]
        assert_same(score(engine, batch), score(reference, batch), f"round {round_}",
                    PARTIAL_TOL)  # a query may find only its first pages left
        looked_up += len(batch)
    stats = engine.prefix_cache.stats
    assert stats.evictions > 0 and stats.hits > 0 and stats.bypasses > 0
    assert stats.hits + stats.partial_hits + stats.misses + stats.bypasses == looked_up
    assert stats.cached_tokens <= 100


def test_a_batch_never_evicts_what_it_reads(engines):
    make, reference = engines
    engine = make(100)
    rng = random.Random(5)
    a, b, c = (toks(rng, 40) for _ in range(3))
    score(engine, [request(rng, a)])
    # a is read (hit), b takes the other 40 slots; c would need a's or b's: computed, not cached.
    batch = [request(rng, a), request(rng, b), request(rng, c), request(rng, c)]
    assert_same(score(engine, batch), score(reference, batch), "full pool")
    stats = engine.prefix_cache.stats
    assert (stats.hits, stats.misses, stats.bypasses, stats.evictions) == (1, 2, 2, 0)
    # The next batch may evict: c's three pages (40 tokens) need two of a's (a is the least
    # recently used query), its last two pages first.
    score(engine, [request(rng, c)])
    assert (stats.misses, stats.evictions) == (3, 2)
    # a's first page is left: a partial hit of 16 tokens, scored as a miss would be.
    again = request(rng, a)
    assert_same(score(engine, [again]), score(reference, [again]), "a again", PARTIAL_TOL)
    assert (stats.partial_hits, stats.tokens_reused) == (1, 40 + 16)


def test_a_failed_batch_leaves_no_entry_behind(engines, monkeypatch):
    make, reference = engines
    engine = make(4096)
    rng = random.Random(6)
    query = toks(rng, 30)
    first = request(rng, query)

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    with monkeypatch.context() as patch:
        patch.setattr(engine.model.lm_head, "forward", out_of_memory)  # after the decoder
        with pytest.raises(RuntimeError, match="simulated"):
            score(engine, [first])
    stats = engine.prefix_cache.stats
    assert stats.cached_tokens == 0 and not engine.prefix_cache.pages
    again = request(rng, query)  # computed anew, not read from slots nobody filled
    assert_same(score(engine, [again]), score(reference, [again]), "after a failure")
    assert (stats.misses, stats.hits) == (2, 0)


def test_queries_that_start_alike_share_their_first_pages(engines):
    make, reference = engines
    engine = make(4096)
    rng = random.Random(7)
    history = toks(rng, 40)
    grown = history + toks(rng, 25)  # the same history with newer events appended
    other = history[:PAGE + 3] + toks(rng, 30)  # shares one whole page only
    for query, cached in ((history, 0), (grown, 2 * PAGE), (other, PAGE), (grown, 65)):
        seq = request(rng, query)
        before = engine.prefix_cache.stats.tokens_reused
        assert_same(score(engine, [seq]), score(reference, [seq]), f"{cached} cached",
                    0.0 if cached in (0, len(query)) else PARTIAL_TOL)
        assert engine.prefix_cache.stats.tokens_reused - before == cached
    stats = engine.prefix_cache.stats
    assert (stats.misses, stats.partial_hits, stats.hits) == (1, 2, 1)


def test_different_rerank_queries_share_the_template_prefix(engines, default_model_path):
    """The rerank template's fixed text before the query (system prompt and instruction) is the
    same for every request: its whole pages hit across queries."""
    from ranker_contract.config import YES_NO_PROMPT
    from serve_app.rerank import RerankPrompter
    from serve_app.tokenizer import TextTokenizer

    make, reference = engines
    engine = make(4096)
    prompter = RerankPrompter(YES_NO_PROMPT, TextTokenizer(default_model_path))
    rng = random.Random(8)
    queries = []
    for text in ("capital of France", "how do vaccines work"):
        prefix, _ = prompter.render_prefix(text, YES_NO_PROMPT.default_instruction)
        ids = prompter.tokenizer.encode_query(prefix)  # what the rerank route sends as query
        queries.append([t % 512 for t in ids])  # into the tiny model's vocabulary
    fixed = next(i for i, (a, b) in enumerate(zip(*queries)) if a != b)
    assert fixed >= PAGE  # the template's text before the query spans whole pages
    for query in queries:
        seq = request(rng, query)
        assert_same(score(engine, [seq]), score(reference, [seq]), "rerank query",
                    PARTIAL_TOL)  # the second: a partial hit
    assert engine.prefix_cache.stats.tokens_reused == fixed // PAGE * PAGE


def test_kv_pair_views_the_fused_qkv_buffer_and_copies_otherwise():
    """K and V move together: from CudaOps' fused [T, (Hq + 2 Hk) D] buffer
    as a view of it, from separate tensors as a stacked copy; the same values either way."""
    t, hq, hk, d = 5, 4, 2, 8
    qkv = torch.randn(t, (hq + 2 * hk) * d)
    k = qkv[:, hq * d:(hq + hk) * d].view(t, hk, d)
    v = qkv[:, (hq + hk) * d:].view(t, hk, d)
    pair = kv_pair(k, v)
    assert pair.shape == (t, 2, hk, d) and pair.data_ptr() == k.data_ptr()  # no copy
    assert torch.equal(pair, torch.stack([k, v], dim=1))
    apart = kv_pair(k.clone(), v.clone())
    assert apart.data_ptr() != k.data_ptr() and torch.equal(apart, pair)
    swapped = kv_pair(v, k)  # v before k in the buffer: not the fused layout, so a copy
    assert swapped.data_ptr() != qkv.data_ptr() and torch.equal(swapped[:, 0], v)
