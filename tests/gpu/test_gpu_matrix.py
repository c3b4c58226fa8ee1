"""Every combination of the engine's product axes in one process: precision (bf16, fp8) × CUDA
graphs (off, on) × prefix cache (off, on) × head (causal LM, classifier, classifier from the LM's
label rows): 24 engines, each compared with the eager bf16 engine without cache of its head
(whose parity with HF fp32 test_gpu_engine.py and test_gpu_classifier.py check). For each:
multi-item equal to one item at a time, graph replay equal to eager and bit for bit repeatable,
a prefix-cache hit equal to its miss. Then graph engines built after another one was freed, for
the same model and another, score what their eager engines score.

Scores are compared twice: the raw values (label log-probs, or class logits) and the relevance
a user reads (P(yes) / (P(yes) + P(no)) of the two labels, or sigmoid of the one logit).
Bounds: bf16 engines differ from one another by the summation order of other tiles and batch
shapes, as much as multi-item differs from one at a time in test_gpu_engine.py; FP8 engines
against bf16 by the bounds of test_gpu_fp8.py, and from themselves by its graph-replay bounds
(a GEMM on other rows re-draws part of the e4m3 rounding)."""

import gc
import itertools
import math
import random

import pytest

from gpu_worker.forward.engine import Engine
from ranker_contract.config import EngineConfig
from ranker_contract.packing import pack_multi_item, pack_plain
from tests.gpu.conftest import LABELS, VOCAB, random_model_folder, run_batch

HEADS = ("causal", "classifier", "classifier_from_labels")
BUCKETS = (512, 1024, 2048)  # enough for the batches here; fewer captures than the default
# (max |Δ value|, max |Δ relevance|)
SAME_BF16 = (5e-2, 5e-3)
FP8_VS_BF16 = (0.6, 0.15)
SAME_FP8 = (0.2, 0.06)


def relevance(row: list[float]) -> float:
    if len(row) == 1:
        return 1 / (1 + math.exp(-row[0]))
    return 1 / (1 + math.exp(row[1] - row[0]))


def differences(got, want) -> tuple[float, float]:
    """(max |Δ value|, max |Δ relevance|) over every item of every sequence."""
    value = score = 0.0
    for s1, s2 in zip(got, want, strict=True):
        for r1, r2 in zip(s1, s2, strict=True):
            value = max(value, *(abs(a - b) for a, b in zip(r1, r2, strict=True)))
            score = max(score, abs(relevance(r1) - relevance(r2)))
    return value, score


def within(got, want, bounds, what):
    value, score = differences(got, want)
    print(f"{what}: max |Δ value| {value:.2e}, max |Δ relevance| {score:.2e}")
    assert all(math.isfinite(x) for s in got for r in s for x in r), what
    assert value <= bounds[0] and score <= bounds[1], what


def tokens(rng, n):
    return [rng.randrange(VOCAB) for _ in range(n)]


@pytest.fixture(scope="module")
def workload():
    """One batch a graph bucket holds: a cacheable query with items of mixed lengths, another
    request, and a plain sequence."""
    rng = random.Random(38)
    query, items = tokens(rng, 200), [tokens(rng, n) for n in (30, 1, 57, 12, 90)]
    batch = [pack_multi_item(query, items, 0),
             pack_multi_item(tokens(rng, 80), [tokens(rng, 40)] * 3, 0),
             pack_plain(tokens(rng, 150), 0)]
    return query, items, batch


@pytest.fixture(scope="module")
def base_engines(qwen3_path):
    """(head, precision) → an eager engine without cache; its model serves every combination."""
    cls_path = random_model_folder("0.6b-cls")
    engines = {}
    for head, precision in itertools.product(HEADS, ("bf16", "fp8")):
        path = cls_path if head == "classifier" else qwen3_path
        engines[head, precision] = Engine.from_config(
            path, EngineConfig(device="cuda", precision=precision),
            head_from_labels=tuple(LABELS) if head == "classifier_from_labels" else None)
    return engines


def labels_of(head: str) -> list[int]:
    return LABELS if head == "causal" else [0]


@pytest.mark.parametrize("head, precision, graphs, cache", [
    (head, precision, graphs, cache) for head in HEADS for precision in ("bf16", "fp8")
    for graphs in (False, True) for cache in (False, True)])
def test_every_combination_scores_what_the_eager_bf16_engine_scores(
        base_engines, workload, head, precision, graphs, cache):
    base = base_engines[head, precision]
    engine = Engine(base.model, base.device, EngineConfig(
        device="cuda", precision=precision,
        cuda_graphs={"enabled": graphs, "token_buckets": BUCKETS},
        prefix_cache={"tokens": 16384 if cache else 0, "min_tokens": 64, "min_query_share": 0.0}))
    labels, name = labels_of(head), f"{head} {precision} graphs={graphs} cache={cache}"
    query, items, batch = workload
    same = SAME_BF16 if precision == "bf16" else SAME_FP8

    reference = run_batch(base_engines[head, "bf16"], batch, labels)
    first = run_batch(engine, batch, labels)  # idle: a graph replay where one applies
    within(first, reference, SAME_BF16 if precision == "bf16" else FP8_VS_BF16,
           f"{name} vs eager bf16")

    alone = [run_batch(engine, [pack_plain(query + item, k)], labels)[0][0]
             for k, item in enumerate(items)]
    within([alone], [first[0]], same, f"{name}: one at a time vs multi-item")

    again = run_batch(engine, batch, labels)
    if cache:  # the same query again: read from the cache
        assert engine.prefix_cache.stats.hits >= 1, name
        within(again, first, same, f"{name}: hit vs miss")
    if graphs:
        rows = sum(s.num_items for s in batch)
        assert engine.graphs.pick(batch, rows, rows * len(labels)) is not None, name
        if not cache:  # the batch replayed a graph: again, bit for bit
            assert again == first, name
        eager = run_batch(engine, batch, labels, eager=True)
        within(first, eager, same, f"{name}: replay vs eager")


def test_graph_engines_built_after_others_were_freed_score_the_same(base_engines, workload):
    """The fault this guards against (gpu_worker/attention/flashinfer.py, FlashInferGraphAttention):
    graphs captured after another engine's were freed read that engine's stale plan indices and
    hit an illegal address. Here: the default buckets captured and freed, then graphs for the
    same model and for another one; each replay scores what its eager engine scores."""
    batch = workload[2]
    causal, classifier = base_engines["causal", "bf16"], base_engines["classifier", "bf16"]
    first = Engine(causal.model, causal.device,
                   EngineConfig(device="cuda", cuda_graphs={"enabled": True}))
    before = run_batch(first, batch)
    del first  # its graphs and their wrappers' pinned buffers are freed here
    gc.collect()
    small = EngineConfig(device="cuda", cuda_graphs={"enabled": True, "token_buckets": BUCKETS})
    for engine, labels in ((Engine(causal.model, causal.device, small), LABELS),
                           (Engine(classifier.model, classifier.device, small), [0])):
        replayed = run_batch(engine, batch, labels)
        within(replayed, run_batch(engine, batch, labels, eager=True), SAME_BF16,
               "rebuilt graphs: replay vs eager")
        if labels == LABELS:
            within(replayed, before, SAME_BF16, "rebuilt graphs vs the first ones")
