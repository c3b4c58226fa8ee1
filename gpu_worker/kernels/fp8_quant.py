"""Per-row dynamic FP8 quantization (Triton, GPU only): one program reads a row once, takes its
amax and writes e4m3 values and the row's fp32 scale (docs/ARCHITECTURE.md, "FP8"). The second
kernel first computes SiLU(gate) * up from the gate/up GEMM's output, so down_proj's input is
never written in bf16 and read back."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, FP8_MAX: tl.constexpr,
                          MIN_SCALE: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < K
    x = tl.load(x_ptr + row * K + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) / FP8_MAX, MIN_SCALE)
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * K + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


@triton.jit
def _silu_mul_quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, FP8_MAX: tl.constexpr,
                                   MIN_SCALE: tl.constexpr, K: tl.constexpr,
                                   BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < K
    gate = tl.load(x_ptr + row * 2 * K + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * K + K + cols, mask=mask, other=0.0).to(tl.float32)
    # Rounded to the input dtype as the unfused silu_and_mul stores it, so both quantize alike.
    x = (gate / (1.0 + tl.exp(-gate)) * up).to(x_ptr.dtype.element_ty).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) / FP8_MAX, MIN_SCALE)
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * K + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def _launch(kernel, x: torch.Tensor, k: int, fp8_max: float,
            min_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One program per row of `x`, writing e4m3 [M, k] and fp32 scales [M, 1]."""
    x = x.contiguous()
    m = x.shape[0]
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        block = triton.next_power_of_2(k)
        kernel[(m,)](x, q, scale, FP8_MAX=fp8_max, MIN_SCALE=min_scale, K=k, BLOCK=block,
                     num_warps=min(16, max(4, block // 1024)))
    return q, scale


def quantize_rows_fp8(x: torch.Tensor, fp8_max: float,
                      min_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] → e4m3 [M, K] and fp32 scales [M, 1]: scale = max(amax / fp8_max, min_scale)."""
    return _launch(_quantize_rows_kernel, x, x.shape[1], fp8_max, min_scale)


def silu_mul_quantize_rows_fp8(gate_up: torch.Tensor, fp8_max: float,
                               min_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """gate_up [M, 2K] → quantize_rows_fp8(SiLU(gate) * up) in one kernel: e4m3 [M, K], [M, 1]."""
    return _launch(_silu_mul_quantize_rows_kernel, gate_up, gate_up.shape[1] // 2, fp8_max,
                   min_scale)
