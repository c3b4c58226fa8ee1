"""LoRA adapters in peft's format, as this engine's packed linears read them.

peft saves, per adapted projection, `lora_A` [r, in] and `lora_B` [out, r], and adds
`scaling × B A` to the projection's weight (`scaling` = lora_alpha / r, or lora_alpha / √r with
rsLoRA). The engine packs q/k/v into one `qkv_proj` and gate/up into one `gate_up_proj`
(gpu_worker/model/decoder.py, PACKED_MODULES), so an adapter is packed the same way: the A matrices
of the parts, which read the same input, stacked into one [Σr, in]; the B matrices placed block-
diagonally into one [Σout, Σr], each part's rows against its own A rows, a part the adapter
leaves out being a zero block. Then `B_packed A_packed` is exactly the stack of each part's
`B A`, and the scaling is folded into B once. An engine's slots (LoraLinear) are Σr wide at the
configured largest rank, padded to a multiple of RANK_ALIGN; an adapter fills its Σr rows and
the rest are zeros (a zero row of A meets a zero column of B: the product is unchanged), so the
widened GEMMs below keep the tile-aligned K the fused gate/up kernel needs, and one compiled
variant serves every adapter. A `modules_to_save` head (a classifier's `score.weight`) is read
and checked too; the engine scores that adapter's rows with it (gpu_worker/model/heads.py,
AdapterHeads).

`LoraLinear` applies the adapters of a batch beside the base weights (an engine built with
adapter slots puts one in place of each float linear, an `Fp8LoraLinear` in place of each FP8
one); which rows read which adapter comes with each call, from the batch (LoraRows,
gpu_worker/forward/batch.py). Where the output is wider than the input (qkv, gate/up), an adapter's
rows run one GEMM with K widened: [x | x Aᵀ] · [W | B]ᵀ = x Wᵀ + (x Aᵀ) Bᵀ, which costs copies of x
and W; elsewhere (o, down) the delta is added to the output afterwards, which reads and writes the
output once more: each picks the smaller tensor to move. That is the CPU's path and the kernels'
reference: on Hopper every batch with an adapter runs through gpu_worker/kernels/lora.py instead,
one path whatever the batch holds, so that a row's scores follow neither how many adapters its
batch has nor whether a CUDA graph replays it (docs/ARCHITECTURE.md, "LoRA
adapters").
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from gpu_worker.forward.batch import LoraRows
from gpu_worker.model.decoder import PACKED_MODULES, CausalLMForScoring, Linear
from gpu_worker.model.fp8 import Fp8Linear
from ranker_contract.model_config import ModelConfig, ModelFolderError

RANK_ALIGN = 64  # the fused gate/up kernel's BLOCK_K (gpu_worker/kernels/gate_up_silu.py)
# projection name in a checkpoint -> (the engine's packed linear, which part of it)
LINEAR_OF = {part: (packed, k) for packed, parts in PACKED_MODULES.items()
             for k, part in enumerate(parts)} | {"o_proj": ("o_proj", 0),
                                                 "down_proj": ("down_proj", 0)}
_KEY = re.compile(r"(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\."
                  r"(\w+)\.lora_([AB])\.weight")
# adapter_config.json settings this loader cannot honour: each refuses the adapter, naming it
UNSUPPORTED = {"use_dora": False, "lora_bias": False, "rank_pattern": {}, "alpha_pattern": {},
               "layers_to_transform": None, "layer_replication": None}


@dataclass(frozen=True, slots=True)
class LoraPair:
    """One packed linear's adapter: y += (x @ a.T) @ b.T, the scaling already in `b`."""

    a: torch.Tensor  # [Σ rank of the parts, in]
    b: torch.Tensor  # [out, Σ rank of the parts]

    def delta_weight(self) -> torch.Tensor:
        """What merging adds to the packed weight: [out, in]."""
        return self.b @ self.a


@dataclass(frozen=True, slots=True)
class Adapter:
    folder: Path
    rank: int  # the adapter's r (each adapted part's)
    pairs: dict[tuple[int, str], LoraPair]  # (layer, packed linear) -> its adapter
    head: torch.Tensor | None  # a trained classification head (modules_to_save), or None


def part_sizes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Output rows of each part of each packed linear, in packing order."""
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    return {"qkv_proj": (q, kv, kv), "o_proj": (cfg.hidden_size,),
            "gate_up_proj": (cfg.intermediate_size, cfg.intermediate_size),
            "down_proj": (cfg.hidden_size,)}


def load_adapter(folder: str | Path, cfg: ModelConfig, dtype: torch.dtype,
                 device: torch.device) -> Adapter:
    """A peft LoRA folder (adapter_config.json + adapter_model.safetensors) for a base model of
    `cfg`; anything it cannot apply exactly is a ModelFolderError naming it."""
    folder = Path(folder)
    settings = json.loads((folder / "adapter_config.json").read_text())
    if settings.get("peft_type", "LORA") != "LORA":
        raise ModelFolderError(f"{folder}: peft_type {settings['peft_type']!r} is not LORA")
    for key, plain in UNSUPPORTED.items():
        if settings.get(key) not in (plain, None):
            raise ModelFolderError(f"{folder}: adapter_config.json sets {key}, which this "
                                   "service does not support")
    if settings.get("bias", "none") != "none":
        raise ModelFolderError(f"{folder}: bias {settings['bias']!r}: only 'none' is supported")
    rank, alpha = int(settings["r"]), float(settings["lora_alpha"])
    scaling = alpha / math.sqrt(rank) if settings.get("use_rslora") else alpha / rank
    state = load_file(folder / "adapter_model.safetensors", device="cpu")
    parts: dict[tuple[int, str], dict[int, dict[str, torch.Tensor]]] = {}
    head = None
    for key, tensor in state.items():
        if key.endswith("score.weight"):  # modules_to_save of a sequence classifier
            head = tensor
            continue
        match = _KEY.fullmatch(key)
        if match is None or match[2] not in LINEAR_OF:
            raise ModelFolderError(f"{folder}: {key} adapts a module this service does not "
                                   "(the decoder's q, k, v, o, gate, up and down projections)")
        layer, (packed, part) = int(match[1]), LINEAR_OF[match[2]]
        if layer >= cfg.num_hidden_layers:
            raise ModelFolderError(f"{folder}: {key} names layer {layer} of "
                                   f"{cfg.num_hidden_layers}")
        parts.setdefault((layer, packed), {}).setdefault(part, {})[match[3]] = tensor
    sizes = part_sizes(cfg)
    pairs = {}
    for (layer, packed), found in parts.items():
        pairs[(layer, packed)] = _packed_pair(folder, layer, packed, found, sizes[packed],
                                              scaling, dtype, device)
    if head is not None and (not cfg.is_classifier or head.shape[0] != cfg.num_labels):
        raise ModelFolderError(f"{folder}: its score.weight {list(head.shape)} does not fit "
                               "the base model's head")
    return Adapter(folder, rank, pairs, None if head is None else head.to(device, dtype))


def _packed_pair(folder: Path, layer: int, packed: str, found: dict[int, dict[str, torch.Tensor]],
                 sizes: tuple[int, ...], scaling: float, dtype: torch.dtype,
                 device: torch.device) -> LoraPair:
    a_rows, blocks = [], []
    rank_at, out_at = 0, [sum(sizes[:k]) for k in range(len(sizes))]
    for part in sorted(found):
        tensors = found[part]
        if set(tensors) != {"A", "B"}:
            raise ModelFolderError(f"{folder}: layer {layer} {packed} part {part} lacks "
                                   f"lora_{'B' if 'A' in tensors else 'A'}")
        a, b_part = tensors["A"].float(), tensors["B"].float()
        if b_part.shape != (sizes[part], a.shape[0]):
            raise ModelFolderError(f"{folder}: layer {layer} {packed} part {part}: lora_B is "
                                   f"{list(b_part.shape)}, not [{sizes[part]}, {a.shape[0]}]")
        a_rows.append(a)
        blocks.append((out_at[part], rank_at, b_part * scaling))
        rank_at += a.shape[0]
    b = torch.zeros(sum(sizes), rank_at)
    for out, at, block in blocks:
        b[out:out + block.shape[0], at:at + block.shape[1]] = block
    return LoraPair(torch.cat(a_rows).to(device, dtype), b.to(device, dtype))


def slot_rank(packed: str, max_rank: int) -> int:
    """The width of one packed linear's slots: the Σr of its parts at `max_rank`, aligned."""
    parts = len(PACKED_MODULES.get(packed, (packed,)))
    return -(-parts * max_rank // RANK_ALIGN) * RANK_ALIGN


class _LoraSlots:
    """The adapter slots of one linear, shared by LoraLinear and Fp8LoraLinear: A [slots, R, in]
    and B [slots, out, R] (slot s at s - 1, R = slot_rank), allocated once, so loading an
    adapter writes into memory that captured CUDA graphs and the kernels already read; every
    adapter runs at the full width R, zeros past its own Σr, so one compiled variant of each
    kernel serves them all. `reads_rows`: this linear sees the batch's score rows, not its
    tokens (the last layer's o_proj, gate/up and down: gpu_worker/model/decoder.py)."""

    def _allocate_slots(self, reads_rows: bool, slots: int, rank: int,
                        shape: tuple[int, int], dtype: torch.dtype, device: torch.device,
                        kernels: bool) -> None:
        out_features, in_features = shape
        self.reads_rows = reads_rows
        self.lora_a = torch.zeros(slots, rank, in_features, dtype=dtype, device=device)
        self.lora_b = torch.zeros(slots, out_features, rank, dtype=dtype, device=device)
        self.used: set[int] = set()  # the slots whose adapter adapts this linear
        # the Triton kernels (gpu_worker/kernels/lora.py) divide this linear's shape; whether a
        # batch runs them is the batch's (LoraRows.kernels)
        self.kernels = kernels

    def put(self, slot: int, pair: LoraPair | None) -> None:
        """Write an adapter's pair into `slot`, over whatever it held (None: the adapter leaves
        this linear as it is). Queued on the current stream, after every batch launched before,
        so none of them reads it half-written."""
        a, b = self.lora_a[slot - 1], self.lora_b[slot - 1]
        if pair is None:
            self.used.discard(slot)
            a.zero_()
            b.zero_()
            return
        rank = pair.a.shape[0]
        if rank > a.shape[0]:
            raise ValueError(f"an adapter of Σr {rank} does not fit slots of width {a.shape[0]}")
        a[:rank].copy_(pair.a, non_blocking=True)
        a[rank:].zero_()
        b[:, :rank].copy_(pair.b, non_blocking=True)
        b[:, rank:].zero_()
        self.used.add(slot)

    def _through_kernels(self, lora: LoraRows) -> bool:
        """The kernels where the batch runs them and this linear has them, unless no run of
        the batch adapts it (a graph being captured: any may at replay)."""
        return (lora.kernels and self.kernels
                and (lora.any_slot or bool(self._runs(lora))))

    def _runs(self, lora: LoraRows) -> list[tuple[int, int, LoraPair]]:
        """The batch's runs of rows this linear adapts: (start, end, the slot's pair)."""
        return [(start, end, LoraPair(self.lora_a[slot - 1], self.lora_b[slot - 1]))
                for slot, start, end in lora.runs(self.reads_rows) if slot in self.used]


class LoraLinear(_LoraSlots, Linear):
    """A float decoder linear plus its engine's adapter slots (_LoraSlots): x Wᵀ (+ b), and for
    each run of one adapter's rows in the batch, (x Aᵀ) Bᵀ added to those rows."""

    def __init__(self, linear: Linear, reads_rows: bool, slots: int, rank: int,
                 kernels: bool = False) -> None:
        Linear.__init__(self, linear.in_features, linear.out_features,
                        bias=linear.bias is not None, device="meta")
        self.weight, self.bias = linear.weight, linear.bias
        self._allocate_slots(reads_rows, slots, rank, tuple(linear.weight.shape),
                             linear.weight.dtype, linear.weight.device, kernels)
        # K widened where the output is the larger tensor to move (the module docstring)
        self.widen = linear.out_features > linear.in_features

    def forward(self, x: torch.Tensor, lora: LoraRows | None = None) -> torch.Tensor:
        if lora is None:
            return super().forward(x)
        if self._through_kernels(lora):
            return self._kernels(x, lora, swiglu=False)
        runs = self._runs(lora)
        if not runs:
            return super().forward(x)
        if not self.widen:
            y = super().forward(x)
            for start, end, pair in runs:
                y[start:end].addmm_(x[start:end] @ pair.a.t(), pair.b.t())
            return y
        y = x.new_empty(x.shape[0], self.out_features)
        for start, end, rows, weight in self._pieces(x, runs):
            if self.bias is None:
                torch.mm(rows, weight.t(), out=y[start:end])
            else:
                torch.addmm(self.bias, rows, weight.t(), out=y[start:end])
        return y

    def swiglu(self, x, down: Linear, ops, lora: LoraRows | None = None):
        """The base model's own (fused) path for each piece, widened for an adapter's rows;
        unfused where the delta is added after the GEMM (not widened)."""
        if lora is None:
            return super().swiglu(x, down, ops)
        if self._through_kernels(lora):
            return down.rows(self._kernels(x, lora, swiglu=True))
        runs = self._runs(lora)
        if not runs:
            return super().swiglu(x, down, ops)
        if not self.widen:
            return down.rows(ops.silu_and_mul(self(x, lora)))
        pieces = [ops.gate_up_silu(rows, weight) for *_, rows, weight in self._pieces(x, runs)]
        return down.rows(pieces[0] if len(pieces) == 1 else torch.cat(pieces))

    def _kernels(self, x: torch.Tensor, lora: LoraRows, swiglu: bool) -> torch.Tensor:
        from gpu_worker.kernels.lora import lora_add, lora_linear, lora_shrink

        slots = lora.slots(self.reads_rows)
        x = x.contiguous()
        t = lora_shrink(x, self.lora_a, slots)
        if not (self.widen or swiglu):  # a narrow output: cuBLAS, then the deltas in place
            y = super().forward(x)
            lora_add(y, t, self.lora_b, slots)
            return y
        return lora_linear(x, self.weight, t, self.lora_b, slots, self.bias, swiglu)

    def _pieces(self, x: torch.Tensor, runs: list[tuple[int, int, LoraPair]]):
        """x cut at the runs, in order: (start, end, rows, weight), an adapter's rows and weight
        widened by its rank, the rows between them (the base's) as they are."""
        at = 0
        for start, end, pair in runs:
            if at < start:
                yield at, start, x[at:start], self.weight
            rows = x[start:end]
            yield (start, end, torch.cat([rows, rows @ pair.a.t()], dim=1),
                   torch.cat([self.weight, pair.b], dim=1))
            at = end
        if at < x.shape[0]:
            yield at, x.shape[0], x[at:], self.weight


class Fp8LoraLinear(_LoraSlots, nn.Module):
    """An FP8 decoder linear (gpu_worker/model/fp8.py) plus its engine's adapter slots (_LoraSlots).
    The GEMM stays FP8; each adapter's (x Aᵀ) Bᵀ runs in the engine's float dtype and is added
    to its rows of the output in place, x being the rows the FP8 GEMM reads, dequantized: the
    adapter sees the input the base weights see. Through lora_shrink + lora_add on Hopper, else
    on slices (the CPU path and the kernels' reference). Its input form and the methods that
    make it are the FP8 linear's."""

    def __init__(self, linear: Fp8Linear, reads_rows: bool, slots: int, rank: int,
                 kernels: bool = False) -> None:
        nn.Module.__init__(self)
        self.fp8 = linear
        self._allocate_slots(reads_rows, slots, rank, tuple(linear.weight.shape),
                             linear.out_dtype, linear.weight.device, kernels)

    def rows(self, x: torch.Tensor):
        return self.fp8.rows(x)

    def normed_rows(self, x, residual, norm, ops):
        return self.fp8.normed_rows(x, residual, norm, ops)

    def swiglu(self, x, down, ops, lora: LoraRows | None = None):
        return down.swiglu_rows(self(x, lora), ops)

    def swiglu_rows(self, gate_up: torch.Tensor, ops):
        return self.fp8.swiglu_rows(gate_up, ops)

    def forward(self, rows, lora: LoraRows | None = None) -> torch.Tensor:
        y = self.fp8(rows)
        if lora is None:
            return y
        q, scale = rows
        if self._through_kernels(lora):
            from gpu_worker.kernels.lora import lora_add, lora_shrink

            slots = lora.slots(self.reads_rows)
            lora_add(y, lora_shrink(q, self.lora_a, slots, scale), self.lora_b, slots)
            return y
        for start, end, pair in self._runs(lora):
            x = q[start:end].to(y.dtype) * scale[start:end].to(y.dtype)
            y[start:end].addmm_(x @ pair.a.t(), pair.b.t())
        return y


def lora_linears(model: CausalLMForScoring, slots: int, max_rank: int,
                 kernels: bool = False) -> dict[tuple[int, str], LoraLinear | Fp8LoraLinear]:
    """Put a LoraLinear (a float linear) or an Fp8LoraLinear (an FP8 one) with `slots` adapter
    slots of rank up to `max_rank` in place of each decoder linear of `model`; returns them by
    (layer, packed linear name). `kernels`: the Triton kernels (gpu_worker/kernels/lora.py; CUDA,
    Hopper) for each linear whose shape their tiles divide."""
    if kernels:
        from gpu_worker.kernels.lora import fits
    layers = model.model.layers
    out = {}
    for i, layer in enumerate(layers):
        for parent, names in ((layer.self_attn, ("qkv_proj", "o_proj")),
                              (layer.mlp, ("gate_up_proj", "down_proj"))):
            for name in names:
                linear = getattr(parent, name)
                reads_rows = i == len(layers) - 1 and name != "qkv_proj"
                rank = slot_rank(name, max_rank)
                if type(linear) is Fp8Linear:  # always cuBLAS (FP8), then the deltas added
                    n, k = linear.weight.shape
                    lora = Fp8LoraLinear(linear, reads_rows, slots, rank, kernels=kernels
                                         and fits(n, k, swiglu=False, add=True))
                elif type(linear) is Linear:
                    lora = LoraLinear(linear, reads_rows, slots, rank, kernels=kernels
                                      and fits(linear.out_features, linear.in_features,
                                               swiglu=name == "gate_up_proj",
                                               add=(linear.out_features <= linear.in_features
                                                    and name != "gate_up_proj")))
                else:
                    raise ValueError(f"layer {i} {name} is a {type(linear).__name__}, "
                                     "which takes no LoRA adapter")
                setattr(parent, name, lora)
                out[(i, name)] = lora
    return out
