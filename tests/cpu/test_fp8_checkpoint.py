"""Published FP8 checkpoints (gpu_worker/model/fp8_checkpoint.py) on CPU, each written by the
library that defines its format (tests/fp8_checkpoints.py) from a tiny seeded model: the weights and
scales we load against what that library dequantizes them to, scores against HF transformers
loading the same folder, and the layouts refused at start-up, named by their config field.

References: transformers on CPU dequantizes a fine-grained FP8 checkpoint into plain linears;
with compressed-tensors it decompresses the weights and, on each forward, quantizes every
linear's input per token (W8A8 simulated in fp32), or not once `quantization_enabled` is off.
"""

from __future__ import annotations

import functools
import math
import random

import pytest
import torch
from safetensors.torch import load_file

from gpu_worker.forward.engine import Engine
from gpu_worker.model.decoder import Linear
from gpu_worker.model.fp8 import Fp8Linear, quantize_model
from gpu_worker.model.loader import load_model
from ranker_contract.config import EngineConfig, Fp8Config
from ranker_contract.model_config import ModelFolderError
from ranker_contract.packing import pack_multi_item
from tests.cpu.conftest import randomize_weights
from tests.fp8_checkpoints import (
    rewrite_compressed_tensors_config,
    rewrite_fine_grained_config,
    write_compressed_tensors_fp8,
    write_fine_grained_fp8,
)
from tools.fidelity import build_engine
from tools.random_model import save_random_model

CPU = torch.device("cpu")
# Every dimension a multiple of 128: transformers' fine-grained writer leaves any other weight
# unquantized (Fp8Quantize) and its loader refuses partial blocks.
FP8_SHAPE = dict(vocab_size=512, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
FAMILIES = {
    "qwen3": ("Qwen3Config", dict(head_dim=64, tie_word_embeddings=True)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=False)),  # q/k/v biases, untied head
}
WRITERS = {
    "compressed-tensors": write_compressed_tensors_fp8,
    "compressed-tensors-per-tensor": lambda source, dest: write_compressed_tensors_fp8(
        source, dest, weights="tensor"),
    "fine-grained": write_fine_grained_fp8,
}
PACKED = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "self_attn.o_proj": ("o_proj",),
          "mlp.gate_up_proj": ("gate_proj", "up_proj"), "mlp.down_proj": ("down_proj",)}
TOL = 1e-4  # fp32 engine vs fp32 HF on the same weights (tests/cpu/test_engine_parity.py)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """family → a saved fp32 HF checkpoint of FP8_SHAPE."""
    import transformers

    made = {}

    def make(family: str):
        if family not in made:
            config_cls, extra = FAMILIES[family]
            config = getattr(transformers, config_cls)(**FP8_SHAPE, **extra)
            made[family] = save_random_model(tmp_path_factory.mktemp(f"src_{family}"), config,
                                             seed=28, dtype="float32",
                                             reinit=functools.partial(randomize_weights, std=0.08))
        return made[family]

    return make


@pytest.fixture(scope="module")
def checkpoint(source, tmp_path_factory):
    """(format, family) → the FP8 checkpoint that format's library writes from source(family)."""
    made = {}

    def make(fmt: str, family: str = "qwen3"):
        if (fmt, family) not in made:
            dest = tmp_path_factory.mktemp(f"fp8_{fmt}_{family}") / "model"
            made[fmt, family] = WRITERS[fmt](source(family), dest)
        return made[fmt, family]

    return make


def _hf_dequantized(path, activations_quantized=False):
    """HF transformers' fp32 model of an FP8 folder, weights dequantized by the defining library."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        model(torch.tensor([[1]]))  # compressed-tensors decompresses on the first forward
    for module in model.modules():
        if hasattr(module, "quantization_scheme"):
            module.quantization_enabled = activations_quantized
    return model


def _hf_packed(hf, layer: int, packed: str, what: str = "weight") -> torch.Tensor:
    """The HF model's q/k/v (gate/up) `what` of one layer, stacked as our packed linear's."""
    parent = hf.model.layers[layer].get_submodule(packed.split(".")[0])
    return torch.cat([getattr(getattr(parent, p), what).detach().float()
                      for p in PACKED[packed]])


def _linear(model, layer: int, packed: str):
    return model.model.layers[layer].get_submodule(packed)


@pytest.mark.parametrize("fmt, family", [("compressed-tensors", "qwen3"),
                                         ("compressed-tensors", "qwen2"),
                                         ("compressed-tensors-per-tensor", "qwen3")])
def test_compressed_tensors_fp8_loads_as_stored(checkpoint, fmt, family):
    path = checkpoint(fmt, family)
    stored = load_file(path / "model.safetensors")
    model = load_model(path, torch.bfloat16, CPU, precision="fp8")
    hf = _hf_dequantized(path)
    for layer in range(FP8_SHAPE["num_hidden_layers"]):
        for packed, parts in PACKED.items():
            linear = _linear(model, layer, packed)
            assert isinstance(linear, Fp8Linear) and linear.out_dtype == torch.bfloat16
            prefix = f"model.layers.{layer}.{packed.split('.')[0]}."
            raw = [stored[prefix + p + ".weight"] for p in parts]
            # per channel [N, 1], or per tensor [1]: that one scale on each of its rows
            scales = [stored[prefix + p + ".weight_scale"].float().reshape(-1).expand(w.shape[0])
                      for p, w in zip(parts, raw)]
            # the e4m3 bytes and the scales themselves, no re-quantization
            assert torch.equal(linear.weight.view(torch.uint8), torch.cat(raw).view(torch.uint8))
            assert torch.equal(linear.weight_scale, torch.cat(scales)[None])
            assert torch.equal(linear.weight.float() * linear.weight_scale.t(),
                               _hf_packed(hf, layer, packed))
    qkv = _linear(model, 0, "self_attn.qkv_proj")
    if family == "qwen2":  # the bias stays a float parameter beside the e4m3 weight
        assert torch.equal(qkv.bias.float(), _hf_packed(hf, 0, "self_attn.qkv_proj", "bias"))
    else:
        assert qkv.bias is None
    assert isinstance(model.lm_head, torch.nn.Linear)  # ignored by the writer: never FP8


def test_fine_grained_fp8_is_requantized_per_channel_close_to_transformers(checkpoint, source):
    """Block scales become row scales: one more e4m3 rounding of the weights transformers
    dequantizes. Measured here against the rounding the checkpoint itself has (vs its source)."""
    path = checkpoint("fine-grained")
    model = load_model(path, torch.float32, CPU, precision="fp8")
    hf, original = _hf_dequantized(path), _hf_dequantized(source("qwen3"))
    worst = worst_own = 0.0
    for layer in range(FP8_SHAPE["num_hidden_layers"]):
        for packed in PACKED:
            linear = _linear(model, layer, packed)
            assert isinstance(linear, Fp8Linear)
            ours = linear.dequantized().weight.float()
            library = _hf_packed(hf, layer, packed)
            err = ((ours - library).norm() / library.norm()).item()
            own = ((library - _hf_packed(original, layer, packed)).norm()
                   / library.norm()).item()
            worst, worst_own = max(worst, err), max(worst_own, own)
            # each row's largest value keeps its exact dequantized value (amax / 448 scales)
            row_max = library.abs().amax(dim=1)
            assert torch.allclose(ours.abs().amax(dim=1), row_max, rtol=1e-6, atol=0)
    print(f"fine-grained → per channel: relative weight error {worst:.4f} "
          f"(the checkpoint's own vs its fp32 source: {worst_own:.4f})")
    # e4m3 rounds to 3 mantissa bits: a second rounding adds about as much as the first
    assert 0 < worst < 0.04 and worst < 1.5 * worst_own


@pytest.mark.parametrize("fmt", WRITERS)
def test_dequantized_fp8_checkpoint_holds_the_library_dequantized_weights(checkpoint, fmt):
    path = checkpoint(fmt)
    model = load_model(path, torch.float32, CPU, dequantize_fp8=True)
    hf = _hf_dequantized(path)
    for layer in range(FP8_SHAPE["num_hidden_layers"]):
        for packed in PACKED:
            linear = _linear(model, layer, packed)
            assert type(linear) is Linear
            assert torch.equal(linear.weight, _hf_packed(hf, layer, packed))


@pytest.mark.parametrize("fmt", WRITERS)
def test_dequantized_fp8_checkpoint_scores_like_transformers(checkpoint, fmt):
    path = checkpoint(fmt)
    engine = Engine.from_config(path, EngineConfig(fp8=Fp8Config(dequantize_checkpoint=True)))
    worst = _worst_vs_hf(engine, _hf_dequantized(path))
    assert worst <= TOL, f"max |Δ logprob| {worst:.2e}"


def test_compressed_tensors_fp8_simulated_w8a8_scores_like_compressed_tensors(checkpoint):
    """Our FP8 forward off CUDA (Fp8Linear's fp32 simulation of the per-token e4m3 GEMM) on the
    stored weights, against compressed-tensors' own W8A8 simulation of the same checkpoint."""
    path = checkpoint("compressed-tensors")
    model = load_model(path, torch.float32, CPU, precision="fp8")
    fp8 = Engine(model, CPU)  # EngineConfig refuses fp8 on CPU; the model is FP8
    worst = _worst_vs_hf(fp8, _hf_dequantized(path, activations_quantized=True))
    plain = _worst_vs_hf(fp8, _hf_dequantized(path))
    print(f"simulated W8A8 vs compressed-tensors' W8A8: {worst:.2e}; vs its weights without "
          f"activation quantization: {plain:.2e}")
    # The same per-token amax / 448 rounding of the same values: only fp32 summation order
    # differs, which can move a value across an e4m3 rounding boundary now and then.
    assert worst <= 2e-3 and worst < plain / 10


def _worst_vs_hf(engine: Engine, hf) -> float:
    """Max |Δ label log-prob| of a multi-item sequence, engine vs HF scoring query + item."""
    rng = random.Random(28)
    vocab = FP8_SHAPE["vocab_size"]
    query = [rng.randrange(vocab) for _ in range(20)]
    items = [[rng.randrange(vocab) for _ in range(n)] for n in (7, 1, 12)]
    labels = [0, vocab - 1, rng.randrange(vocab)]
    ours = engine.finish(engine.launch([pack_multi_item(query, items, 0)], [labels]))[0]
    worst = 0.0
    for row, item in zip(ours, items):
        with torch.inference_mode():
            logits = hf(torch.tensor([query + item]), use_cache=False).logits[0, -1].float()
        ref = torch.log_softmax(logits, dim=-1)[labels].tolist()
        worst = max(worst, *(abs(a - b) for a, b in zip(row, ref)))
        assert all(math.isfinite(a) for a in row)
    return worst


def test_settings_choose_which_stored_fp8_linears_run_in_fp8(checkpoint):
    """fp8_linears and fp8_bf16_first_layers apply to an FP8 checkpoint too: a stored e4m3
    linear not chosen is dequantized, the chosen ones stay as stored."""
    path = checkpoint("compressed-tensors")
    model = load_model(path, torch.float32, CPU, precision="fp8")
    stored_qkv = _linear(model, 1, "self_attn.qkv_proj").weight.clone()
    expected_down = _linear(model, 1, "mlp.down_proj").dequantized().weight
    setting = Fp8Config(linears=("qkv_proj", "o_proj", "gate_up_proj"), bf16_first_layers=1)
    assert quantize_model(model, setting) == 4 + 1  # layer 0 entirely, layer 1's down_proj
    first = model.model.layers[0]
    assert all(type(m) is Linear for m in (
        first.self_attn.qkv_proj, first.self_attn.o_proj, first.mlp.gate_up_proj,
        first.mlp.down_proj))
    assert torch.equal(_linear(model, 1, "mlp.down_proj").weight, expected_down)
    assert torch.equal(_linear(model, 1, "self_attn.qkv_proj").weight, stored_qkv)


def test_fidelity_tool_compares_the_stored_fp8_with_its_dequantized_weights(checkpoint):
    path = checkpoint("compressed-tensors")
    stored = load_model(path, torch.float32, CPU, precision="fp8")
    fp8 = build_engine(path, "no_down", "cpu").model.model.layers[1]
    assert torch.equal(fp8.self_attn.qkv_proj.weight.view(torch.uint8),
                       stored.model.layers[1].self_attn.qkv_proj.weight.view(torch.uint8))
    down = stored.model.layers[1].mlp.down_proj.dequantized().weight.to(torch.bfloat16)
    assert torch.equal(fp8.mlp.down_proj.weight, down)
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        qkv = build_engine(path, precision, "cpu").model.model.layers[1].self_attn.qkv_proj
        assert type(qkv) is Linear and qkv.weight.dtype == dtype


def test_fp8_checkpoint_with_precision_bf16_needs_dequantize_explicitly(checkpoint):
    with pytest.raises(ModelFolderError, match="engine.fp8.dequantize_checkpoint"):
        Engine.from_config(checkpoint("fine-grained"), EngineConfig())


def test_partly_quantized_packed_projection_is_refused(source, tmp_path):
    path = write_compressed_tensors_fp8(source("qwen3"), tmp_path / "m",
                                        ignore=("lm_head", "re:.*k_proj$"))
    with pytest.raises(ModelFolderError, match="all or none"):
        load_model(path, torch.bfloat16, CPU, precision="fp8")


def _ct_config(preset: str, fmt: str = "float-quantized", **extra):
    """compressed-tensors' config of `preset`, with the `format` its compressor would save."""
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    return QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])},
                              ignore=["lm_head"], quantization_status="compressed", format=fmt,
                              **extra)


def _ct_weights_per_block():
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import FP8_BLOCK, FP8_DYNAMIC

    scheme = QuantizationScheme(targets=["Linear"], weights=FP8_BLOCK["weights"],
                                input_activations=FP8_DYNAMIC["input_activations"])
    return QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"],
                              quantization_status="compressed", format="float-quantized")


def _fp8_weights_only():
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import FP8_DYNAMIC

    return QuantizationScheme(targets=["Linear"], weights=FP8_DYNAMIC["weights"])


def _ct_fp8_kv_cache():
    from compressed_tensors.quantization import QuantizationArgs

    return _ct_config("FP8_DYNAMIC", kv_cache_scheme=QuantizationArgs(
        num_bits=8, type="float", strategy="tensor", dynamic=False))


# (name, the library's config of a layout we do not load, the field the error must name)
CT_REFUSED = [
    ("FP8: static per-tensor activation scales", lambda: _ct_config("FP8"),
     "config_groups.group_0.input_activations.dynamic"),
    ("FP8_BLOCK: 1x128 activation groups", lambda: _ct_config("FP8_BLOCK"),
     "config_groups.group_0.input_activations.strategy"),
    ("W8A8: int8", lambda: _ct_config("W8A8", "int-quantized"), "format"),
    ("W4A16: int4 weights only", lambda: _ct_config("W4A16", "pack-quantized"), "format"),
    ("FP8 weights only", lambda: _ct_config("FP8_DYNAMIC").model_copy(update={
        "config_groups": {"group_0": _fp8_weights_only()}}),
     "config_groups.group_0.input_activations"),
    ("FP8 weights per 128x128 block", _ct_weights_per_block,
     "config_groups.group_0.weights.strategy"),
    ("FP8 KV cache", _ct_fp8_kv_cache, "kv_cache_scheme"),
]


def _fg_config(**settings):
    from transformers import FineGrainedFP8Config

    return FineGrainedFP8Config(**settings)


FG_REFUSED = [
    ("static activation scale", lambda: _fg_config(activation_scheme="static"),
     "activation_scheme"),
    ("ue8m0 scales", lambda: _fg_config(scale_fmt="ue8m0"), "scale_fmt"),
    ("FP8 embeddings", lambda: _fg_config(modules_to_convert=["embed_tokens"]),
     "modules_to_convert"),
    ("one scale per tensor", lambda: _fg_config(weight_block_size=None), "weight_block_size"),
]


@pytest.mark.parametrize("name, config, field", CT_REFUSED + FG_REFUSED,
                         ids=[c[0] for c in CT_REFUSED + FG_REFUSED])
def test_unsupported_layouts_fail_at_start_up_naming_the_field(checkpoint, tmp_path, name,
                                                              config, field):
    if (name, config, field) in CT_REFUSED:
        path = rewrite_compressed_tensors_config(checkpoint("compressed-tensors"),
                                                 tmp_path / "m", config())
    else:
        path = rewrite_fine_grained_config(checkpoint("fine-grained"), tmp_path / "m", config())
    for cfg in (EngineConfig(fp8=Fp8Config(dequantize_checkpoint=True)), EngineConfig()):
        with pytest.raises(ModelFolderError, match=f"quantization_config.{field} is "):
            Engine.from_config(path, cfg)


def test_other_quantization_methods_fail_naming_quant_method(checkpoint, tmp_path):
    from transformers import BitsAndBytesConfig

    path = rewrite_fine_grained_config(checkpoint("fine-grained"), tmp_path / "m",
                                       BitsAndBytesConfig(load_in_8bit=True))
    with pytest.raises(ModelFolderError, match="quantization_config.quant_method 'bitsandbytes'"):
        Engine.from_config(path, EngineConfig(fp8=Fp8Config(dequantize_checkpoint=True)))
