"""Residual add + RMSNorm with an fp32 residual stream (Triton, GPU only).

Keeping the residual in fp32 while activations stay bf16 removes a large rounding source of a
bf16 forward (small sublayer outputs added to a large bf16 residual), for 50% more bytes in this
one memory-bound kernel: closer to HF fp32, a little slower (docs/ARCHITECTURE.md, "Engine";
docs/BENCHMARKS.md, "Earlier measurements").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, q_ptr, scale_ptr, eps, FP8_MAX, MIN_SCALE,
                         N: tl.constexpr, BLOCK: tl.constexpr, QUANTIZE: tl.constexpr):
    program = tl.program_id(0).to(tl.int64)
    row = program * N
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
    res = tl.load(res_ptr + row + cols, mask=mask, other=0.0) + x
    tl.store(res_ptr + row + cols, res, mask=mask)
    scale = tl.rsqrt(tl.sum(res * res, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (res * scale * w).to(x_ptr.dtype.element_ty)
    if QUANTIZE:  # e4m3 rows for an FP8 linear, quantized from the bf16 values as stored
        y = y.to(tl.float32)
        row_scale = tl.maximum(tl.max(tl.abs(y), axis=0) / FP8_MAX, MIN_SCALE)
        q = tl.clamp(y / row_scale, -FP8_MAX, FP8_MAX)
        tl.store(q_ptr + row + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + program, row_scale)
    else:
        tl.store(x_ptr + row + cols, y, mask=mask)


def add_rms_norm_fp32_residual(
    x: torch.Tensor,  # [T, H] bf16, contiguous: the sublayer output; overwritten by the result
    residual: torch.Tensor,  # [T, H] fp32, contiguous: residual += x, in place
    weight: torch.Tensor,  # [H]
    eps: float,
    fp8: tuple[float, float] | None = None,  # (largest e4m3 value, smallest row scale)
) -> tuple[torch.Tensor | tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """(the normed rows, residual); with `fp8` the rows come quantized instead, as e4m3 [T, H]
    and fp32 row scales [T, 1] (gpu_worker/model/fp8.py::quantize_rows), and x is left as it was."""
    t, n = x.shape
    q = scale = x  # unused without fp8
    if fp8 is not None:
        q = torch.empty((t, n), dtype=torch.float8_e4m3fn, device=x.device)
        scale = torch.empty((t, 1), dtype=torch.float32, device=x.device)
    if t:
        _add_rms_norm_kernel[(t,)](x, residual, weight, q, scale, eps,
                                   *(fp8 if fp8 is not None else (1.0, 1.0)), N=n,
                                   BLOCK=triton.next_power_of_2(n), QUANTIZE=fp8 is not None)
    return (x if fp8 is None else (q, scale)), residual
