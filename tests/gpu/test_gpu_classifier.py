"""A Qwen3-0.6B-shaped Qwen3ForSequenceClassification (one class, seeded random bf16, made by
`python -m tools.random_model --shape 0.6b-cls`) on the GPU engine (bf16, FlashInfer, fused ops):
its class logit against HF fp32 `AutoModelForSequenceClassification` on query + item alone,
multi-item against one item at a time, CUDA-graph replays against eager, and the start-up path
(memory probe and warm-up batches) on a one-class head, a prefix-cache hit against no cache.
Then rerank.classifier_from_labels on the causal 0.6B: sigmoid of its yes-minus-no head against
HF fp32's P(yes) / (P(yes) + P(no))."""

import math
import random

import pytest
import torch

from gpu_worker.forward.engine import Engine
from gpu_worker.forward.startup import measure_budget, warm_up
from ranker_contract.config import EngineConfig
from ranker_contract.packing import pack_multi_item, pack_plain
from tests.gpu.conftest import LABELS, random_model_folder, run_batch, softmax

CLASSES = [0]
GPU = EngineConfig(device="cuda")


def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


def _request(rng: random.Random, query_len=120, item_lens=(180, 1, 0, 57, 180, 3, 99, 12)):
    vocab = 151643  # real tokens only (the pad token, 151643, is left out: HF pools before it)
    query = [rng.randrange(vocab) for _ in range(query_len)]
    return query, [[rng.randrange(vocab) for _ in range(n)] for n in item_lens]


def _hf_logits(hf, query, items):
    """HF's fp32 logits for query + item alone, one tensor per item (its batch row)."""
    with torch.inference_mode():
        return [hf(torch.tensor([query + item], device="cuda")).logits[0].float()
                for item in items]


@pytest.fixture(scope="module")
def cls_path():
    return random_model_folder("0.6b-cls")


@pytest.fixture(scope="module")
def cls_engine(cls_path):
    return Engine.from_config(cls_path, GPU)


def test_parity_with_hf_fp32(cls_engine, cls_path):
    from transformers import AutoModelForSequenceClassification

    hf = AutoModelForSequenceClassification.from_pretrained(cls_path, dtype=torch.float32)
    hf = hf.cuda().eval()
    query, items = _request(random.Random(1))
    (ours,) = run_batch(cls_engine, [pack_multi_item(query, items, 0)], CLASSES)
    refs = [logits[0].item() for logits in _hf_logits(hf, query, items)]  # [classes] each
    del hf
    worst_logit = max(abs(row[0] - ref) for row, ref in zip(ours, refs, strict=True))
    worst_p = max(abs(_sigmoid(row[0]) - _sigmoid(ref)) for row, ref in zip(ours, refs))
    spread = max(abs(ref) for ref in refs)
    torch.cuda.empty_cache()
    print(f"max |Δ logit| {worst_logit:.2e} (|logit| up to {spread:.2f}), "
          f"max |Δ sigmoid| {worst_p:.2e}")
    assert worst_logit <= 5e-2 and worst_p <= 5e-3


def test_multi_item_equals_one_at_a_time(cls_engine):
    query, items = _request(random.Random(2))
    (packed,) = run_batch(cls_engine, [pack_multi_item(query, items, 0)], CLASSES)
    alone = [run_batch(cls_engine, [pack_plain(query + item, 0)], CLASSES)[0][0]
             for item in items]
    worst = max(abs(a[0] - b[0]) for a, b in zip(packed, alone))
    print(f"max |Δ logit| multi-item vs alone: {worst:.2e}")
    assert worst <= 5e-2


def test_cuda_graph_replay_equals_eager(cls_engine):
    graphs = Engine(cls_engine.model, cls_engine.device, EngineConfig(
        device="cuda", cuda_graphs={"enabled": True, "token_buckets": (1024, 2048)}))
    rng = random.Random(3)
    sequences = [pack_multi_item(*_request(rng, 60, (40, 0, 7, 90)), 0),
                 pack_plain(_request(rng, 300)[0], 0)]
    assert graphs.graphs.pick(sequences, 5, 5) is not None  # this batch replays a graph
    replayed = graphs.finish(graphs.launch(sequences, [CLASSES] * 2))
    eager = cls_engine.finish(cls_engine.launch(sequences, [CLASSES] * 2, eager=True))
    worst = max(abs(a[0] - b[0]) for s1, s2 in zip(replayed, eager) for a, b in zip(s1, s2))
    print(f"max |Δ logit| CUDA graph vs eager: {worst:.2e}")
    assert all(math.isfinite(r[0]) for s in replayed for r in s)
    assert worst <= 5e-2


def test_the_start_up_path_runs_on_a_one_class_head(cls_engine):
    """measure_budget and warm_up launch their own label ids: valid for a one-class head."""
    budget = measure_budget(cls_engine, 16384, 4096)
    assert budget.tokens >= 4096 and budget.capacity_tokens_per_s > 0
    warm_up(cls_engine, budget.tokens, 4096)


def test_head_from_label_rows_gives_hfs_yes_no_relevance(qwen3_path, fast_engine):
    from transformers import AutoModelForCausalLM

    converted = Engine.from_config(qwen3_path, GPU, head_from_labels=tuple(LABELS))
    query, items = _request(random.Random(4))
    seq = [pack_multi_item(query, items, 0)]
    (ours,) = run_batch(converted, seq, CLASSES)
    (today,) = run_batch(fast_engine, seq)  # the LM head, log-probs of LABELS = (yes, no)
    del converted
    hf = AutoModelForCausalLM.from_pretrained(qwen3_path, dtype=torch.float32).cuda().eval()
    # P(yes) / (P(yes) + P(no)) at each item's last token ([tokens, vocab] logits each)
    refs = [softmax(torch.log_softmax(logits[-1], -1)[LABELS].tolist())[0]
            for logits in _hf_logits(hf, query, items)]
    del hf
    worst_hf = max(abs(_sigmoid(row[0]) - ref) for row, ref in zip(ours, refs, strict=True))
    worst_today = max(abs(_sigmoid(row[0]) - softmax(lm_row)[0])
                      for row, lm_row in zip(ours, today, strict=True))
    torch.cuda.empty_cache()
    print(f"head from label rows: max |Δ relevance| vs HF fp32 {worst_hf:.2e}, "
          f"vs the LM-head path {worst_today:.2e}")
    assert worst_hf <= 5e-3 and worst_today <= 5e-3


def test_a_prefix_cache_hit_scores_what_no_cache_scores(cls_engine):
    """The head reads the score rows whatever computed them: a hit (item blocks against cached
    query K/V, FlashInfer) gives the logits the cache-less engine gives."""
    cached = Engine(cls_engine.model, cls_engine.device, EngineConfig(
        device="cuda", prefix_cache={"tokens": 16384, "min_tokens": 64}))
    rng = random.Random(5)
    query = _request(rng, 500)[0]
    for name, item_lens in (("miss", (180, 40, 90)), ("hit", (7, 180, 33, 120))):
        items = [[rng.randrange(151643) for _ in range(n)] for n in item_lens]
        seq = [pack_multi_item(query, items, 0)]
        (got,) = run_batch(cached, seq, CLASSES)
        (want,) = run_batch(cls_engine, seq, CLASSES)
        worst = max(abs(a[0] - b[0]) for a, b in zip(got, want))
        print(f"prefix cache {name}: max |Δ logit| vs no cache {worst:.2e}")
        assert worst <= 5e-2, name
    assert (cached.prefix_cache.stats.misses, cached.prefix_cache.stats.hits) == (1, 1)
