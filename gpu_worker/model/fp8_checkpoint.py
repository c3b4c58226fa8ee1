"""Published FP8 checkpoints, loaded as they are (docs/ARCHITECTURE.md, "FP8 checkpoints").

config.json's `quantization_config.quant_method` names the layout; two are loaded:
  compressed-tensors  llm-compressor's FP8_DYNAMIC: e4m3 `weight` [N, K] and `weight_scale`
                      [N, 1] (one per output channel; or [1], one per tensor, repeated on every
                      row), activations dynamic per token. That is Fp8Linear's own format: the
                      values load unchanged.
  fp8                 transformers' fine-grained FP8: e4m3 `weight` and `weight_scale_inv`
                      [N / bn, K / bk] (one per block), activations dynamic. Fp8Linear keeps one
                      scale per row, so each weight is dequantized in fp32 and its rows are
                      quantized again: one more e4m3 rounding (docs/OPERATIONS.md, "FP8
                      checkpoints").
Any other layout or setting is refused before the weights are read, naming the config field.

With precision fp8 the decoder layers' linears stored in e4m3 become Fp8Linear; with precision
bf16 only `engine.fp8.dequantize_checkpoint` lets such a folder load, every e4m3 tensor then
dequantized (weight x scale in fp32, as both libraries do) to the engine's dtype. An e4m3
tensor outside the decoder linears (an lm_head not ignored) is always dequantized: the head
never runs in FP8.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from gpu_worker.model.decoder import PACKED_MODULES, CausalLMForScoring
from gpu_worker.model.fp8 import FP8, Fp8Linear, quantize_rows
from ranker_contract.model_config import ModelFolderError

logger = logging.getLogger(__name__)

# The checkpoint's per-layer linears that Fp8Linear can hold (names before packing).
DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SCALE = "weight_scale"  # what an Fp8Linear's per-channel scale is called in the packed state
FP8_DTYPES = tuple(getattr(torch, n) for n in dir(torch) if n.startswith("float8_"))
# compressed-tensors' QuantizationArgs defaults, for fields a config leaves out
_CT_ARG_DEFAULTS = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": False}


@dataclass(frozen=True)
class Fp8Checkpoint:
    """How one FP8 model folder loads: its layout, and whether it stays in FP8."""

    folder: Path
    quant_method: str  # "compressed-tensors" or "fp8"
    block: tuple[int, int] | None  # fine-grained (rows, columns) per scale; None: per channel
    keep_fp8: bool  # precision fp8: decoder linears load as Fp8Linear
    dtype: torch.dtype  # the engine's: Fp8Linear outputs and dequantized weights

    @classmethod
    def from_folder(cls, folder: Path, dtype: torch.dtype, precision: str,
                    dequantize: bool) -> Fp8Checkpoint | None:
        """None for a checkpoint without `quantization_config`; raises ModelFolderError for one
        that cannot load (a layout not supported, or precision bf16 without dequantizing)."""
        config = json.loads((folder / "config.json").read_text())
        if config.get("quantization_config") is None:
            return None
        quant, block = config["quantization_config"], None
        method = quant.get("quant_method")
        if method == "compressed-tensors":
            _check_compressed_tensors(folder, quant)
        elif method == "fp8":
            block = _check_fine_grained(folder, quant)
        else:
            raise ModelFolderError(
                f"{folder}: quantization_config.quant_method {method!r} is not supported; FP8 "
                "checkpoints load from 'compressed-tensors' (FP8_DYNAMIC) or 'fp8' "
                "(transformers' fine-grained FP8)")
        if precision != "fp8" and not dequantize:
            raise ModelFolderError(
                f"{folder} is an FP8 checkpoint (quantization_config.quant_method {method!r}): "
                "set engine.precision: fp8 to run it in FP8, or engine.fp8.dequantize_checkpoint:"
                " true to run its dequantized weights in bf16 (float32 on cpu)")
        return cls(folder, method, block, precision == "fp8", dtype)

    @property
    def scale_name(self) -> str:
        return "weight_scale_inv" if self.quant_method == "fp8" else "weight_scale"

    def dequantize(self, name: str, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """e4m3 [N, K] x its scales → fp32 [N, K], in the defining library's order (fp32
        product; transformers' Fp8Dequantize, compressed-tensors' dequantize)."""
        rows, cols = weight.shape
        if self.block is None:
            return weight.float() * self.row_scales(name, weight, scale)
        bn, bk = self.block
        if rows % bn or cols % bk or tuple(scale.shape) != (rows // bn, cols // bk):
            # transformers refuses partial blocks too (Fp8Dequantize: "not divisible")
            raise ModelFolderError(
                f"{self.folder}: {name}.weight [{rows}, {cols}] with weight_scale_inv "
                f"{list(scale.shape)} does not tile into quantization_config.weight_block_size "
                f"{list(self.block)}")
        blocks = weight.float().reshape(rows // bn, bn, cols // bk, bk)
        return (blocks * scale.float()[:, None, :, None]).reshape(rows, cols)

    def row_scales(self, name: str, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """compressed-tensors' [N, 1] channel or [1] tensor scale → fp32 [N, 1] (exact)."""
        rows = weight.shape[0]
        if tuple(scale.shape) not in ((rows, 1), (1,), ()):
            raise ModelFolderError(f"{self.folder}: {name}.weight_scale has shape "
                                   f"{tuple(scale.shape)}; expected ({rows}, 1) or (1,)")
        return scale.float().reshape(-1, 1).expand(rows, 1).contiguous()

    def prepare(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors (before packing) → per decoder linear kept in FP8, e4m3
        `weight` and fp32 `weight_scale` [N, 1]; every other e4m3 weight dequantized."""
        kept, dequantized = [], 0
        suffix = "." + self.scale_name
        for scale_key in [k for k in state if k.endswith(suffix)]:
            name = scale_key[: -len(suffix)]
            weight, scale = state.pop(name + ".weight", None), state.pop(scale_key)
            if weight is None or weight.dtype != FP8:
                raise ModelFolderError(f"{self.folder}: {scale_key} scales no e4m3 weight (found "
                                       f"{None if weight is None else weight.dtype})")
            if self.keep_fp8 and name.rsplit(".", 1)[-1] in DECODER_LINEARS:
                if self.block is None:  # one scale per row (or per tensor): exact
                    row_scales = self.row_scales(name, weight, scale)
                    state[name + ".weight"], state[name + "." + SCALE] = weight, row_scales
                else:
                    q, row_scale = quantize_rows(self.dequantize(name, weight, scale))
                    state[name + ".weight"], state[name + "." + SCALE] = q, row_scale
                kept.append(name)
            else:
                state[name + ".weight"] = self.dequantize(name, weight, scale).to(self.dtype)
                dequantized += 1
        unscaled = [k for k, v in state.items() if v.dtype in FP8_DTYPES and
                    not (k.endswith(".weight") and k[: -len(".weight")] in kept)]
        if unscaled:
            raise ModelFolderError(f"{self.folder}: {unscaled[:3]} are stored in "
                                   f"{state[unscaled[0]].dtype} without a {self.scale_name}")
        self._check_packed_groups(set(kept))
        if self.keep_fp8:
            how = ("as stored" if self.block is None else
                   f"re-quantized per output channel from {self.block[0]}x{self.block[1]} blocks")
            logger.info("%s: FP8 checkpoint (%s): %d decoder linears load in FP8 %s; %d other "
                        "FP8 weights dequantized to %s", self.folder, self.quant_method,
                        len(kept), how, dequantized, self.dtype)
        else:
            logger.warning("%s: FP8 checkpoint (%s) dequantized to %s "
                           "(engine.fp8.dequantize_checkpoint): %d weights", self.folder,
                           self.quant_method, self.dtype, dequantized)
        return state

    def _check_packed_groups(self, kept: set[str]) -> None:
        """q/k/v (gate/up) run as one packed GEMM: all of them in FP8, or none."""
        for parts in PACKED_MODULES.values():
            for name in [n for n in kept if n.endswith("." + parts[0])]:
                siblings = [name[: -len(parts[0])] + p for p in parts]
                if not all(s in kept for s in siblings):
                    raise ModelFolderError(
                        f"{self.folder}: of {siblings} only some are stored in FP8; the packed "
                        "projection needs all or none (adjust the checkpoint's ignore list)")

    def install(self, model: CausalLMForScoring, state: dict[str, torch.Tensor],
                device: torch.device) -> None:
        """After packing: put an empty Fp8Linear where `state` holds an e4m3 weight, so that
        load_state_dict assigns the stored values (scales reshaped to its [1, N])."""
        for scale_key in [k for k in state if k.endswith("." + SCALE)]:
            name = scale_key[: -len("." + SCALE)]
            parent_name, attr = name.rsplit(".", 1)
            parent = model.get_submodule(parent_name)
            linear: nn.Linear = getattr(parent, attr)
            state[scale_key] = state[scale_key].reshape(1, -1)
            weight = torch.empty(linear.weight.shape, dtype=FP8, device="meta")
            setattr(parent, attr, Fp8Linear(weight, torch.empty(state[scale_key].shape,
                                                                device="meta"),
                                            linear.bias, self.dtype, device))


def load_dtype(key: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    """What a loaded tensor is cast to: `dtype`, except e4m3 weights and their fp32 scales."""
    return tensor.dtype if tensor.dtype == FP8 or key.endswith("." + SCALE) else dtype


def _refuse(folder: Path, field: str, value, supported) -> None:
    raise ModelFolderError(f"{folder}: quantization_config.{field} is {value!r}; supported: "
                           f"{supported!r} (docs/OPERATIONS.md, 'FP8 checkpoints')")


def _check_compressed_tensors(folder: Path, quant: dict) -> None:
    """Only FP8_DYNAMIC, compressed: e4m3 weights with static per-channel (or per-tensor)
    scales, inputs quantized per token at run time, nothing else quantized."""
    for field, supported in (("format", "float-quantized"), ("quantization_status", "compressed")):
        if quant.get(field) != supported:
            _refuse(folder, field, quant.get(field), supported)
    for field in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if quant.get(field):  # null or empty: nothing of that kind
            _refuse(folder, field, quant[field], None)
    groups = quant.get("config_groups") or {}
    if not groups:
        _refuse(folder, "config_groups", groups, "one FP8_DYNAMIC group")
    for group_name, group in groups.items():
        path = f"config_groups.{group_name}"
        if group.get("format") not in (None, "float-quantized"):
            _refuse(folder, f"{path}.format", group["format"], "float-quantized")
        # activations first: a static scale is the likeliest reason a group cannot load
        for part, dynamic, strategies in (("input_activations", True, ("token",)),
                                          ("weights", False, ("channel", "tensor"))):
            args = group.get(part)
            if args is None:  # e.g. weight-only FP8: its activations were never quantized
                _refuse(folder, f"{path}.{part}", None, f"8-bit float, {strategies[0]}")
            want = {"type": ("float",), "num_bits": (8,), "dynamic": (dynamic,),
                    "strategy": strategies, "symmetric": (True,)}
            for field, values in want.items():
                got = args.get(field, _CT_ARG_DEFAULTS.get(field))
                if got not in values:
                    _refuse(folder, f"{path}.{part}.{field}", got,
                            values[0] if len(values) == 1 else values)
            for field in ("group_size", "block_structure", "actorder"):
                if args.get(field) is not None:
                    _refuse(folder, f"{path}.{part}.{field}", args[field], None)
        if group.get("output_activations") is not None:
            _refuse(folder, f"{path}.output_activations", group["output_activations"], None)


def _check_fine_grained(folder: Path, quant: dict) -> tuple[int, int]:
    """Only e4m3 weights with fp32 block scales and dynamic activations; returns the block."""
    checks = (("fmt", quant.get("fmt", "e4m3"), "e4m3"),
              ("activation_scheme", quant.get("activation_scheme", "dynamic"), "dynamic"),
              ("scale_fmt", quant.get("scale_fmt", "float"), "float"))
    for field, value, supported in checks:
        if value != supported:
            _refuse(folder, field, value, supported)
    if quant.get("modules_to_convert"):  # FP8 embeddings
        _refuse(folder, "modules_to_convert", quant["modules_to_convert"], None)
    block = quant.get("weight_block_size")
    if not (isinstance(block, list | tuple) and len(block) == 2
            and all(isinstance(b, int) and b > 0 for b in block)):
        _refuse(folder, "weight_block_size", block, "[rows, columns], e.g. [128, 128]")
    return block[0], block[1]
