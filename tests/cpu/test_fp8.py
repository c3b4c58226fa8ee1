"""FP8 (gpu_worker/model/fp8.py) on CPU: the quantization arithmetic, which linears are swapped, the
settings that refuse to start, and the simulated W8A8 engine's scores (multi-item equal to
one item at a time; close to the unquantized engine)."""

import math

import pytest
import torch

from gpu_worker.forward.engine import Engine
from gpu_worker.model.fp8 import Fp8Linear, quantize_model, quantize_rows
from gpu_worker.model.loader import load_model
from ranker_contract.config import EngineConfig, Fp8Config
from ranker_contract.packing import pack_multi_item, pack_plain


def test_rows_quantize_to_e4m3_with_amax_over_448_scales():
    x = torch.tensor([[448.0, -224.0, 1.0, 0.0], [0.5, 0.25, -0.125, 0.0], [0.0, 0.0, 0.0, 0.0]])
    q, scale = quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (3, 1)
    assert scale[0].item() == 1.0 and scale[1].item() == pytest.approx(0.5 / 448, rel=1e-6)
    assert q[0].float().tolist() == [448.0, -224.0, 1.0, 0.0]  # exact in e4m3
    assert q[1].float().tolist() == [448.0, 224.0, -112.0, 0.0]
    assert q[2].float().tolist() == [0.0] * 4 and scale[2].item() > 0  # no division by zero


def test_fp8_linear_is_within_e4m3_rounding_of_the_float_linear():
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 64, bias=True)
    x = torch.randn(32, 256)
    fp8_linear = Fp8Linear.from_linear(linear)
    exact, fp8 = linear(x), fp8_linear(fp8_linear.rows(x))
    # e4m3 keeps 3 mantissa bits (relative rounding <= 1/16) on both operands; over a 256-term
    # dot product the errors mostly cancel: a few percent of the output's scale.
    err = (fp8 - exact).norm() / exact.norm()
    assert 0 < err < 0.06
    assert fp8.dtype == exact.dtype


def test_quantize_model_swaps_the_chosen_linears(tiny_checkpoint):
    model = load_model(tiny_checkpoint("qwen3"), torch.float32, torch.device("cpu"))
    layers = len(model.model.layers)
    assert quantize_model(model, Fp8Config()) == 4 * layers
    assert quantize_model(model, Fp8Config()) == 0  # already FP8: nothing left to swap
    model = load_model(tiny_checkpoint("qwen3"), torch.float32, torch.device("cpu"))
    setting = Fp8Config(linears=("qkv_proj", "gate_up_proj"), bf16_first_layers=1)
    assert quantize_model(model, setting) == 2 * (layers - 1)
    first, second = model.model.layers[0], model.model.layers[1]
    assert isinstance(first.self_attn.qkv_proj, torch.nn.Linear)
    assert isinstance(second.self_attn.qkv_proj, Fp8Linear)
    assert isinstance(second.self_attn.o_proj, torch.nn.Linear)
    assert isinstance(model.lm_head, torch.nn.Linear)  # never quantized


def test_fp8_refuses_to_start_where_it_cannot_run():
    with pytest.raises(ValueError, match="engine.precision: fp8 needs engine.device 'cuda'"):
        EngineConfig(precision="fp8")


def test_simulated_fp8_engine_scores_items_as_alone_and_close_to_unquantized(tiny_checkpoint):
    path = tiny_checkpoint("qwen3")
    exact = Engine.from_config(path, EngineConfig())
    model = load_model(path, torch.float32, torch.device("cpu"))
    quantize_model(model, Fp8Config())
    fp8 = Engine(model, torch.device("cpu"))
    query, items, labels = [5, 9, 13, 2], [[7, 8, 9], [11], [3, 4, 5, 6, 7]], [[1, 2, 3]]
    packed = [pack_multi_item(query, items, 0)]
    multi = fp8.finish(fp8.launch(packed, labels))[0]
    for k, item in enumerate(items):
        alone = fp8.finish(fp8.launch([pack_plain(query + item, k)], labels))[0][0]
        # per-token scales: a token's quantization does not depend on the other items
        assert max(abs(a - b) for a, b in zip(multi[k], alone)) < 1e-4
    reference = exact.finish(exact.launch(packed, labels))[0]
    diff = max(abs(math.exp(a) - math.exp(b)) for ra, rb in zip(multi, reference)
               for a, b in zip(ra, rb))
    assert 0 < diff < 0.1  # quantized (not identical), but the same distribution roughly
