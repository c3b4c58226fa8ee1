"""FP8 checkpoints written by the libraries that define their formats, from a saved HF folder
(the CPU tests' tiny checkpoints, the GPU tests' 0.6B shape).

compressed-tensors: llm-compressor's path without llm-compressor itself (it would pull a
training stack): `apply_quantization_config` with the FP8_DYNAMIC preset, each weight's scale
from compressed-tensors' `calculate_qparams` over its per-channel min/max (what llm-compressor's
min-max observer feeds it), then `ModelCompressor.compress_model`, `save_pretrained` and
`update_config`, the save sequence ModelCompressor's own docstring gives.

transformers' fine-grained FP8: `from_pretrained(quantization_config=FineGrainedFP8Config())`
quantizes at load (transformers' Fp8Quantize: e4m3 weights, fp32 `weight_scale_inv` per 128x128
block) and `save_pretrained` writes it. transformers 5.24 refuses that on a machine without a
GPU ("No GPU or XPU found", the quantizer's validate_environment) though the quantization
itself is plain torch; without CUDA that one check is skipped, nothing else.
"""

from __future__ import annotations

import shutil
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import torch


def write_compressed_tensors_fp8(source: Path, dest: Path, dtype=torch.bfloat16,
                                 ignore: tuple[str, ...] = ("lm_head",),
                                 weights: str = "channel") -> Path:
    """`source` quantized with compressed-tensors' FP8_DYNAMIC preset, but for `ignore`
    (module names or "re:" patterns, as llm-compressor takes them). `weights="tensor"`: the
    preset with one weight scale per tensor instead of per channel (llm-compressor's examples
    mix the two)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.quant_scheme import FP8_DYNAMIC
    from compressed_tensors.quantization.utils import calculate_qparams
    from compressed_tensors.utils import update_offload_parameter
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    weight_args = FP8_DYNAMIC["weights"].model_copy(update={"strategy": weights})
    scheme = QuantizationScheme(targets=["Linear"], weights=weight_args,
                                input_activations=FP8_DYNAMIC["input_activations"])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme},
                                                        ignore=list(ignore)))
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is None:
            continue
        weight = module.weight.detach()
        dims = {"dim": -1, "keepdim": True} if weights == "channel" else {}
        scale, zero_point = calculate_qparams(weight.amin(**dims), weight.amax(**dims),
                                              module.quantization_scheme.weights)
        update_offload_parameter(module, "weight_scale", scale)
        update_offload_parameter(module, "weight_zero_point", zero_point)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(dest)
    compressor.update_config(dest)
    _copy_tokenizer(source, dest)
    return dest


def write_fine_grained_fp8(source: Path, dest: Path, dtype=torch.bfloat16) -> Path:
    """`source` quantized by transformers' FineGrainedFP8Config (128x128 blocks)."""
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    skip_gpu_check = (nullcontext() if torch.cuda.is_available() else mock.patch.object(
        FineGrainedFP8HfQuantizer, "validate_environment", lambda *args, **kwargs: None))
    with skip_gpu_check:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, quantization_config=FineGrainedFP8Config())
    model.save_pretrained(dest)
    _copy_tokenizer(source, dest)
    return dest


def rewrite_compressed_tensors_config(folder: Path, dest: Path, config) -> Path:
    """A copy of `folder` whose quantization_config is compressed-tensors' `config` (a
    QuantizationConfig), written by ModelCompressor.update_config."""
    from compressed_tensors.compressors import ModelCompressor

    shutil.copytree(folder, dest)
    ModelCompressor(quantization_config=config).update_config(dest)
    return dest


def rewrite_fine_grained_config(folder: Path, dest: Path, config) -> Path:
    """A copy of `folder` whose quantization_config is transformers' `config`, serialised by
    transformers (PretrainedConfig.save_pretrained)."""
    from transformers import AutoConfig

    shutil.copytree(folder, dest)
    model_config = AutoConfig.from_pretrained(folder)
    model_config.quantization_config = config.to_dict()
    model_config.save_pretrained(dest)
    return dest


def _copy_tokenizer(source: Path, dest: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        if (source / name).is_file():
            shutil.copy(source / name, dest / name)
