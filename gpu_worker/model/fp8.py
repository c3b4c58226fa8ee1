"""FP8 (W8A8, e4m3) linears: per-output-channel weight scales, per-token activation scales
(docs/ARCHITECTURE.md, "FP8").

At load the chosen linears of every decoder layer are quantized from bf16: each weight row gets
scale = amax / 448 and is stored as e4m3. At run time each input row is quantized the same way
and the GEMM runs on FP8 tensor cores (`torch._scaled_mm`, row-wise scales, fp32 accumulation,
bf16 out, the bias in its epilogue). Embeddings, norms, attention, the LM head at the score rows
and the log-softmax stay as they are. Off CUDA, `Fp8Linear` computes the same quantized values
with an fp32 matmul: a simulation for the fidelity tool (tools/fidelity.py), never served.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpu_worker.model.decoder import CausalLMForScoring, Linear, Ops, RMSNorm
from ranker_contract.config import FP8_LINEARS, Fp8Config

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest e4m3 value
MIN_SCALE = 1.0 / (FP8_MAX * 512)  # an all-zero row (padding) must not divide by zero
MIN_CAPABILITY = (8, 9)  # Ada and Hopper have FP8 tensor cores

QuantizedRows = tuple[torch.Tensor, torch.Tensor]  # e4m3 [M, K], fp32 row scales [M, 1]


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] → e4m3 [M, K] and fp32 scales [M, 1], one per row: x ≈ q * scale (torch ops; the
    reference the Triton kernel of gpu_worker/kernels/fp8_quant.py follows on CUDA)."""
    scale = (x.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=MIN_SCALE)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def silu_mul_quantize_rows(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows(SiLU(gate) * up) of [M, 2K], the product in gate_up's dtype (torch ops; the
    reference of the fused Triton kernel)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return quantize_rows(F.silu(gate) * up)


def row_quantizer(device: torch.device, silu_mul: bool = False
                  ) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """quantize_rows (or silu_mul_quantize_rows) for tensors on `device`: one Triton kernel on
    CUDA, torch ops elsewhere. Resolved once per linear, so the per-layer forward imports
    nothing."""
    if device.type != "cuda":
        return silu_mul_quantize_rows if silu_mul else quantize_rows
    from gpu_worker.kernels.fp8_quant import (  # Triton: GPU hosts only
        quantize_rows_fp8,
        silu_mul_quantize_rows_fp8,
    )

    kernel = silu_mul_quantize_rows_fp8 if silu_mul else quantize_rows_fp8
    return functools.partial(kernel, fp8_max=FP8_MAX, min_scale=MIN_SCALE)


class Fp8Linear(nn.Module):
    """y = x W^T (+ b) with W in e4m3 and one fp32 scale per output channel. Built from a float
    linear (`from_linear`, quantized here) or from e4m3 weights a checkpoint stores
    (gpu_worker/model/fp8_checkpoint.py); `device` picks the activation quantizer when `weight` is
    still on the meta device."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor,
                 bias: nn.Parameter | None, out_dtype: torch.dtype,
                 device: torch.device | None = None) -> None:
        super().__init__()
        self.quantize = row_quantizer(device or weight.device)
        self.quantize_silu_mul = row_quantizer(device or weight.device, silu_mul=True)
        self.weight = nn.Parameter(weight, requires_grad=False)  # [N, K] e4m3
        scale = weight_scale.reshape(1, -1).float().contiguous()
        self.weight_scale = nn.Parameter(scale, requires_grad=False)  # [1, N]
        self.bias = bias
        self.out_dtype = out_dtype

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        weight, scale = row_quantizer(linear.weight.device)(linear.weight.detach())
        return cls(weight, scale, linear.bias, linear.weight.dtype)

    def dequantized(self) -> Linear:
        """The float linear these e4m3 values and scales stand for (exact in fp32)."""
        weight = self.weight.float() * self.weight_scale.t()
        linear = Linear(weight.shape[1], weight.shape[0], bias=self.bias is not None,
                        device="meta")
        linear.weight = nn.Parameter(weight.to(self.out_dtype), requires_grad=False)
        linear.bias = self.bias
        return linear

    # The input form of an FP8 linear: quantized rows, (e4m3 [M, K], fp32 scales [M, 1]). The
    # methods below are model.Linear's, each making that form (gpu_worker/model/decoder.py).

    def rows(self, x: torch.Tensor) -> QuantizedRows:
        return self.quantize(x)

    def normed_rows(self, x, residual, norm: RMSNorm, ops: Ops):
        """The norm writes the quantized rows itself (one kernel on CudaOps)."""
        return ops.add_rms_norm_fp8(x, residual, norm.weight, norm.eps)

    def swiglu(self, x: QuantizedRows, down: Linear | Fp8Linear, ops: Ops, lora=None):
        return down.swiglu_rows(self(x), ops)

    def swiglu_rows(self, gate_up: torch.Tensor, ops: Ops) -> QuantizedRows:
        """SiLU(gate) * up, quantized in the same kernel."""
        return self.quantize_silu_mul(gate_up)

    def forward(self, rows: QuantizedRows, lora=None) -> torch.Tensor:
        """`lora`: unused here (an Fp8LoraLinear's, gpu_worker/model/lora.py)."""
        q, scale = rows
        if q.is_cuda:
            return torch._scaled_mm(q, self.weight.t(), scale_a=scale, scale_b=self.weight_scale,
                                    bias=self.bias, out_dtype=self.out_dtype)
        out = (q.float() * scale) @ (self.weight.float() * self.weight_scale.t()).t()
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(self.out_dtype)


def quantize_model(model: CausalLMForScoring, setting: Fp8Config) -> int:
    """Make the linears `setting` chooses Fp8Linear in place, and the others float: a float
    linear is quantized here; one loaded in e4m3 from an FP8 checkpoint but not chosen is
    dequantized. Returns how many linears changed."""
    layers = model.model.layers
    swapped = 0
    for i, layer in enumerate(layers):
        in_fp8 = setting.bf16_first_layers <= i < len(layers) - setting.bf16_last_layers
        for parent in (layer.self_attn, layer.mlp):
            for name in FP8_LINEARS:
                linear = getattr(parent, name, None)
                if in_fp8 and name in setting.linears and isinstance(linear, Linear):
                    setattr(parent, name, Fp8Linear.from_linear(linear))
                    swapped += 1
                elif not (in_fp8 and name in setting.linears) and isinstance(linear, Fp8Linear):
                    setattr(parent, name, linear.dequantized())
                    swapped += 1
    return swapped


def check_fp8_device(device: torch.device) -> None:
    """Serving FP8 needs FP8 tensor cores: refuse anything else at start-up, naming the setting."""
    if device.type != "cuda":
        raise ValueError("engine.precision: fp8 needs device 'cuda' (FP8 tensor cores); "
                         "use precision bf16 on CPU")
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        raise ValueError(f"engine.precision: fp8 needs a GPU of compute capability 8.9 or newer "
                         f"(this one: {capability[0]}.{capability[1]}); use precision bf16")
