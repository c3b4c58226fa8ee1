"""Deterministic scores (docs/ARCHITECTURE.md, "Deterministic scores"): random (query, item) pairs,
each scored alone as the reference (a CUDA graph replay), then in other compositions (requests of
1 to 500 items, several sequences, other requests beside, graphs and eager: each mixed run's
first batch is past the largest graph, a prefix-cache miss, hits and partial hits); every label
log-prob must equal its lone one bit for bit, bf16 and FP8.

Three sets: 1,000 pairs of queries of 32 to 200 tokens and items of 1 to 300 (a tenth of them
short, up to 31 tokens: the short-item kernel's, gpu_worker/attention/short_items.py, in the same
sequences as FlashInfer's longer ones); and 500 of short items (1 to 31 tokens) after queries of
16 to 300, pairs of which start alike (a partial hit), whose blocks average so few rows that
FlashInfer's eager planner would take a narrower tile
(gpu_worker/attention/flashinfer.py::add_tile_request); and 300 pairs on LoRA adapters (two, and
the model alone), alone, in batches of one adapter and in batches that mix them. A partial hit
of items longer than 31 tokens is not among them: it differs (docs/ARCHITECTURE.md,
"Deterministic scores")."""

import random

import pytest

from gpu_worker.attention.flashinfer import add_tile_request, paged_layout
from gpu_worker.attention.short_items import short_item_tokens
from gpu_worker.forward.engine import Engine
from gpu_worker.model.lora import load_adapter
from ranker_contract.config import EngineConfig, LoraConfig
from ranker_contract.model_config import ModelConfig
from tests.gpu.conftest import LABELS, ids
from tests.support.compositions import pack, score_batch


def score_requests(engine, batches, eager=False, adapter_of=None):
    """{pair key: label log-probs} of every batch of `batches` (score_batch)."""
    return {key: row for batch in batches
            for key, row in score_batch(engine, batch, LABELS, eager, adapter_of).items()}


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


def differences(got, lone, label=""):
    """{composition: (pairs whose label log-probs differ from alone, max |Δ|)} of `got`
    ({composition: {pair key: label log-probs}}), each printed."""
    differ = {}
    for name, scores in got.items():
        assert scores.keys() == lone.keys(), name
        deltas = [max(abs(a - b) for a, b in zip(scores[k], lone[k])) for k in lone]
        differ[name] = (sum(d > 0 for d in deltas), max(deltas))
        print(f"{label}{name}: {differ[name][0]} of {len(deltas)} pairs differ, max |Δ| "
              f"{differ[name][1]:.3g}")
    return differ


def compositions(engine, rng, queries, items):
    """Score every pair of `items` ({(query index, item index): ids}) alone, then in each
    composition (mixed batches: the first past the largest graph, the rest of 1 to 6 requests).
    Returns {composition: (pairs that differ from alone, max |Δ|)}, the prefix cache's counts and
    each query's sequences."""
    by_query = [[key for key in items if key[0] == q] for q in range(len(queries))]

    def request(keys):
        return keys, pack(queries[keys[0][0]], [items[k] for k in keys])

    alone = [[request([key])] for key in items]
    lone = score_requests(engine, alone)
    assert all(engine.graphs.pick(seqs, 1, len(LABELS)) for [(_, seqs)] in alone)

    # each query's items in one request, split over sequences of 4,096 tokens
    whole = [[(keys, pack(queries[keys[0][0]], [items[k] for k in keys], max_seq_tokens=4096))]
             for keys in (rng.sample(q_keys, len(q_keys)) for q_keys in by_query)]
    # every query's items shuffled into requests of 1 to 40, shuffled into batches
    requests = []
    for q_keys in by_query:
        keys = rng.sample(q_keys, len(q_keys))
        while keys:
            n = rng.randint(1, 40)
            requests.append(request(keys[:n]))
            keys = keys[n:]
    rng.shuffle(requests)

    def fits_a_graph(batch):
        n = sum(len(keys) for keys, _ in batch)
        return engine.graphs.pick([s for _, seqs in batch for s in seqs], n,
                                  n * len(LABELS)) is not None

    # The first batch takes requests until no graph holds it (more tokens or items than the
    # largest), so the mixed run always takes the eager path too, whatever the pairs' sizes.
    at = 1
    while at < len(requests) and fits_a_graph(requests[:at]):
        at += 1
    mixed = [requests[:at]]
    while at < len(requests):
        n = rng.randint(1, 6)
        mixed.append(requests[at:at + n])
        at += n
    graphs_used = sum(map(fits_a_graph, mixed))
    assert 0 < graphs_used < len(mixed)  # both paths in the mixed run

    # on an engine with the prefix cache, each request a batch of its own
    cached = with_prefix_cache(engine)
    got = {
        "alone, eager": score_requests(engine, alone, eager=True),
        "each query's items in one request, several sequences": score_requests(engine, whole),
        "mixed requests and batches, graphs where they fit": score_requests(engine, mixed),
        "the same batches, eager": score_requests(engine, mixed, eager=True),
        "the same requests, through the prefix cache": score_requests(cached,
                                                                     [[r] for r in requests]),
    }
    differ = differences(got, lone)
    sequences = {q: sum(len(seqs) for keys, seqs in requests if keys[0][0] == q)
                 for q in range(len(queries))}
    return differ, cached.prefix_cache.stats, sequences


def test_a_score_does_not_depend_on_its_batch(engine):
    rng = random.Random(53)
    items_per_query = [500, 100, 100, 100, 100, 100]  # 1,000 pairs
    queries = [ids(rng, rng.randint(32, 200)) for _ in items_per_query]
    items = {(q, i): ids(rng, rng.randint(1, 300))
             for q, n in enumerate(items_per_query) for i in range(n)}
    assert 50 < sum(len(item) < 32 for item in items.values()) < 200  # both kernels' items
    differ, stats, sequences = compositions(engine, rng, queries, items)
    # each query's first request a miss, every later one a hit
    assert (stats.misses, stats.hits, stats.partial_hits) == (
        len(queries), sum(sequences.values()) - len(queries), 0)
    assert all(n == 0 for n, _ in differ.values()), differ


def test_short_items_and_queries_that_start_alike(engine):
    rng = random.Random(5353)
    first, third = ids(rng, 200), ids(rng, 280)
    queries = [first, first[:96] + ids(rng, 60),  # 6 pages of 16 tokens alike
               ids(rng, rng.randint(16, 31)),  # too short to cache
               third, third[:160] + ids(rng, 20)]  # 10 pages alike
    items_per_query = [200, 100, 100, 50, 50]  # 500 pairs
    items = {(q, i): ids(rng, rng.randint(1, 31))
             for q, n in enumerate(items_per_query) for i in range(n)}
    mcfg = engine.model.config
    group = mcfg.num_attention_heads // mcfg.num_key_value_heads
    short = short_item_tokens(mcfg)
    assert short == 32  # an item of up to 31 tokens and its delimiter: the kernel's
    # the lone eager batches include some the planner would have run on a narrower tile
    assert any(add_tile_request(*paged_layout(pack(queries[q], [items[q, i]]), short=short)[:2],
                                group, mcfg.head_dim) for q, i in items)
    differ, stats, sequences = compositions(engine, rng, queries, items)
    # of each pair of queries alike, the first to come a miss and the other a partial hit;
    # every later request of the four a hit; the short query never looked up
    cacheable = sum(n for q, n in sequences.items() if q != 2)
    assert (stats.misses, stats.partial_hits, stats.hits) == (2, 2, cacheable - 4)
    assert all(n == 0 for n, _ in differ.values()), differ


@pytest.fixture(scope="module")
def adapter_folders(qwen3_path, tmp_path_factory):
    """Two seeded peft adapters of the model: rank 16 on all seven projections, rank 8 on three."""
    from tests.support.adapters import ALL, write_adapters

    made = write_adapters(qwen3_path, tmp_path_factory.mktemp("adapters"), {
        "all": {"r": 16, "lora_alpha": 16, "target_modules": ALL},
        "some": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj", "gate_proj"]}})
    return [adapter for adapter, _ in made.values()]


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_a_score_on_an_adapter_does_not_depend_on_its_batch(qwen3_path, adapter_folders,
                                                            precision):
    engine = Engine.from_config(qwen3_path, EngineConfig(
        device="cuda", precision=precision, cuda_graphs={"enabled": True}),
        lora=LoraConfig(slots=4, max_rank=16))
    model_cfg = ModelConfig.from_folder(qwen3_path)
    for folder in adapter_folders:
        engine.add_adapter(load_adapter(folder, model_cfg, engine.dtype, engine.device))
    assert engine.graphs.lora  # a lone request on an adapter replays a graph
    rng = random.Random(530)
    queries = [ids(rng, rng.randint(32, 200)) for _ in range(6)]
    items = {(q, i): ids(rng, rng.randint(32, 300)) for q in range(6) for i in range(50)}

    def adapter_of(key):  # the model alone, then each adapter, for every query in turn
        return key[0] % 3

    def request(keys):
        return keys, pack(queries[keys[0][0]], [items[k] for k in keys])

    alone = [[request([key])] for key in items]
    lone = score_requests(engine, alone, adapter_of=adapter_of)
    requests = []
    for q in range(6):
        keys = rng.sample([k for k in items if k[0] == q], 50)
        while keys:
            n = rng.randint(1, 25)
            requests.append(request(keys[:n]))
            keys = keys[n:]
    rng.shuffle(requests)
    mixed = [requests[at:at + 4] for at in range(0, len(requests), 4)]
    # batches of one adapter's requests (or the model's alone)
    one_each = [[r for r in requests if adapter_of(r[0][0]) == slot] for slot in range(3)]
    got = {
        "alone, eager": score_requests(engine, alone, True, adapter_of),
        "each query's items in one request": score_requests(
            engine, [[request([k for k in items if k[0] == q])] for q in range(6)],
            adapter_of=adapter_of),
        "batches mixing the adapters and the model": score_requests(engine, mixed,
                                                                    adapter_of=adapter_of),
        "the same batches, eager": score_requests(engine, mixed, True, adapter_of),
        "one adapter's requests in a batch": score_requests(engine, one_each,
                                                            adapter_of=adapter_of),
    }
    differ = differences(got, lone, f"{precision} adapters, ")
    assert all(n == 0 for n, _ in differ.values()), differ
