"""Residual add + RMSNorm with an fp32 residual stream (Triton, GPU only).

Keeping the residual in fp32 while activations stay bf16 removes a large rounding source of a
bf16 forward (small sublayer outputs added to a large bf16 residual), for 50% more bytes in this
one memory-bound kernel: closer to HF fp32, a little slower (docs/ARCHITECTURE.md, "Engine";
the bf16/fp32 residual A/B is docs/results/bench_engine_h100*.json at 8e4c5b0, listed in
docs/BENCHMARKS.md, "Earlier measurements").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, eps, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * N
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
    res = tl.load(res_ptr + row + cols, mask=mask, other=0.0) + x
    tl.store(res_ptr + row + cols, res, mask=mask)
    scale = tl.rsqrt(tl.sum(res * res, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_ptr + row + cols, (res * scale * w).to(x_ptr.dtype.element_ty), mask=mask)


def add_rms_norm_fp32_residual(
    x: torch.Tensor,  # [T, H] bf16, contiguous: the sublayer output; overwritten by the result
    residual: torch.Tensor,  # [T, H] fp32, contiguous: residual += x, in place
    weight: torch.Tensor,  # [H]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    t, n = x.shape
    if t:
        _add_rms_norm_kernel[(t,)](x, residual, weight, eps, N=n,
                                   BLOCK=triton.next_power_of_2(n))
    return x, residual
