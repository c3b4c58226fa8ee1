"""Published FP8 checkpoints (gpu_worker/model/fp8_checkpoint.py) on the GPU: the 0.6B shape's
weights written by compressed-tensors (FP8_DYNAMIC) and by transformers (fine-grained, 128x128
blocks; tests/fp8_checkpoints.py), served with precision fp8, against the same checkpoint
dequantized and served in bf16 (engine.fp8.dequantize_checkpoint).

Bounds: those of tests/gpu/test_gpu_fp8.py. Both engines hold the same e4m3 weights (the block
layout re-quantized per channel: about as much rounding again, tests/cpu/test_fp8_checkpoint.py),
so what differs is the per-token activation quantization and the weight rounding to bf16 of the
dequantized engine, which the bf16-checkpoint bound already covers."""

import random

import pytest

from gpu_worker.forward.engine import Engine
from gpu_worker.model.fp8 import Fp8Linear
from ranker_contract.config import EngineConfig
from tests.fp8_checkpoints import write_compressed_tensors_fp8, write_fine_grained_fp8
from tests.gpu.conftest import run_batch, worst_difference
from tests.gpu.test_gpu_fp8 import (
    _config,
    _requests,
    assert_multi_item_bounds,
    multi_item_differences,
)

WRITERS = {"compressed-tensors": write_compressed_tensors_fp8,
           "fine-grained": write_fine_grained_fp8}


@pytest.fixture(scope="module", params=list(WRITERS))
def checkpoint(request, qwen3_path, tmp_path_factory):
    return WRITERS[request.param](qwen3_path, tmp_path_factory.mktemp("fp8_ckpt") / "model")


@pytest.fixture(scope="module")
def engines(checkpoint):
    """(fp8 engine on the stored e4m3 weights, bf16 engine on their dequantized values)."""
    fp8 = Engine.from_config(checkpoint, _config())
    bf16 = Engine.from_config(checkpoint, EngineConfig(
        device="cuda", fp8={"dequantize_checkpoint": True}))
    return fp8, bf16


def test_fp8_checkpoint_loads_every_linear_in_fp8(engines):
    fp8, bf16 = engines
    for layer in (fp8.model.model.layers[0], fp8.model.model.layers[-1]):
        assert all(isinstance(m, Fp8Linear) for m in (
            layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
            layer.mlp.down_proj))
    assert not any(isinstance(m, Fp8Linear) for m in bf16.model.modules())


def test_fp8_checkpoint_scores_stay_near_its_dequantized_bf16(engines):
    fp8, bf16 = engines
    sequences = _requests(random.Random(3))
    lp, p = worst_difference(run_batch(fp8, sequences), run_batch(bf16, sequences))
    print(f"fp8 checkpoint vs dequantized bf16 over {sum(s.num_items for s in sequences)} items: "
          f"max |Δ logprob| {lp:.3e}, max |Δ softmax| {p:.3e}")
    assert 0 < lp <= 0.6 and p <= 0.15


def test_fp8_checkpoint_multi_item_equals_one_at_a_time(engines):
    fp8, _ = engines
    assert_multi_item_bounds(multi_item_differences(fp8))
