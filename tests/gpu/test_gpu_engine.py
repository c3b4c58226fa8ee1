"""The GPU engine (bf16, FlashInfer) against HF fp32, against itself one item at a time, against
the torch backend, overlap against sync, the launch path free of host syncs, and the fused
gate/up kernel against the unfused path."""

import math
import random

import pytest
import torch

from gpu_worker.forward.engine import Engine
from ranker_contract.config import EngineConfig
from ranker_contract.packing import pack_multi_item, pack_plain
from tests.gpu.conftest import LABELS, launch_checking_no_host_sync, run_batch, scheduled, softmax


def _request(rng: random.Random, query_len=120, item_lens=(180, 1, 0, 57, 180, 3, 99, 180, 12, 30)):
    vocab = 151643  # real tokens only
    query = [rng.randrange(vocab) for _ in range(query_len)]
    return query, [[rng.randrange(vocab) for _ in range(n)] for n in item_lens]


@pytest.fixture(scope="module")
def hf_fp32(qwen3_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(qwen3_path, dtype=torch.float32).cuda().eval()


def test_parity_with_hf_fp32(fast_engine, hf_fp32):
    query, items = _request(random.Random(1))
    (ours,) = run_batch(fast_engine, [pack_multi_item(query, items, 0)])
    worst_lp = worst_p = 0.0
    for item, row in zip(items, ours):
        with torch.inference_mode():
            logits = hf_fp32(torch.tensor([query + item], device="cuda")).logits[0, -1]
        ref = torch.log_softmax(logits.float(), -1)[LABELS].tolist()
        worst_lp = max(worst_lp, *(abs(a - b) for a, b in zip(row, ref)))
        worst_p = max(worst_p, *(abs(a - b) for a, b in zip(softmax(row), softmax(ref))))
    print(f"max |Δ logprob| {worst_lp:.2e}, max |Δ softmax score| {worst_p:.2e}")
    assert worst_lp <= 5e-2 and worst_p <= 5e-3


def test_multi_item_equals_one_at_a_time(fast_engine):
    query, items = _request(random.Random(2))
    (packed,) = run_batch(fast_engine, [pack_multi_item(query, items, 0)])
    alone = [run_batch(fast_engine, [pack_plain(query + item, 0)])[0][0] for item in items]
    worst = max(abs(a - b) for r1, r2 in zip(packed, alone)
                for a, b in zip(softmax(r1), softmax(r2)))
    print(f"max |Δ softmax score| multi-item vs alone: {worst:.2e}")
    assert worst <= 5e-3


def test_empty_query_multi_item(fast_engine):
    """With no query, delimiter rows attend to nothing: they must not leak NaN into items."""
    _, items = _request(random.Random(6), query_len=0)
    items = [item for item in items if item]
    (packed,) = run_batch(fast_engine, [pack_multi_item([], items, 0)])
    alone = [run_batch(fast_engine, [pack_plain(item, 0)])[0][0] for item in items]
    assert all(math.isfinite(x) for row in packed for x in row)
    worst = max(abs(a - b) for r1, r2 in zip(packed, alone)
                for a, b in zip(softmax(r1), softmax(r2)))
    print(f"max |Δ softmax score| empty query, multi-item vs alone: {worst:.2e}")
    assert worst <= 5e-3


def test_flashinfer_equals_torch_backend(fast_engine):
    reference = Engine(fast_engine.model, fast_engine.device, reference=True)
    rng = random.Random(3)
    sequences = [pack_multi_item(*_request(rng), 0), pack_plain(_request(rng)[0], 0),
                 pack_multi_item(*_request(rng, 40, (5, 0, 300)), 0)]
    fast, slow = run_batch(fast_engine, sequences), run_batch(reference, sequences)
    worst = max(abs(a - b) for s1, s2 in zip(fast, slow) for r1, r2 in zip(s1, s2)
                for a, b in zip(r1, r2))
    print(f"max |Δ logprob| flashinfer vs torch backend (bf16): {worst:.2e}")
    assert worst <= 5e-2


def test_overlap_bitwise_equals_sync(fast_engine):
    rng = random.Random(4)
    sequences = [pack_multi_item(*_request(rng), 0) for _ in range(12)]
    assert scheduled(fast_engine, sequences, True) == scheduled(fast_engine, sequences, False)


def test_launch_path_has_no_host_sync(fast_engine):
    rng = random.Random(5)
    sequences = [pack_multi_item(*_request(rng), 0) for _ in range(4)]
    step = launch_checking_no_host_sync(fast_engine, sequences)
    assert len(fast_engine.finish(step)) == 4


def test_fused_gate_up_equals_unfused_in_a_large_batch(fast_engine):
    """Batches from FUSED_GATE_UP_MIN_TOKENS tokens run the fused gate/up kernel: the same
    scores as cuBLAS + SiLU-and-mul, and no host sync on their launch path."""
    from gpu_worker.model.ops import FUSED_GATE_UP_MIN_TOKENS

    unfused = Engine(fast_engine.model, fast_engine.device, EngineConfig(device="cuda"))
    unfused.ops.fused_gate_up = False  # what a GPU without TMA runs
    rng = random.Random(7)
    sequences = [pack_multi_item(*_request(rng), 0) for _ in range(24)]  # ~21k tokens
    assert sum(s.num_tokens for s in sequences) >= FUSED_GATE_UP_MIN_TOKENS
    assert fast_engine.ops.fused_gate_up and not unfused.ops.fused_gate_up
    fused_scores, unfused_scores = run_batch(fast_engine, sequences), run_batch(unfused, sequences)
    worst = max(abs(a - b) for s1, s2 in zip(fused_scores, unfused_scores)
                for r1, r2 in zip(s1, s2) for a, b in zip(r1, r2))
    print(f"max |Δ logprob| fused vs unfused gate/up, {len(sequences)} sequences: {worst:.2e}")
    assert worst <= 1e-3
    step = launch_checking_no_host_sync(fast_engine, sequences)
    assert len(fast_engine.finish(step)) == len(sequences)
