"""The log-sum-exp of each score row's logits over the vocabulary (Triton, GPU only).

One program per row, one pass over its logits in the order of the columns, in fp32: a row's
result depends on its own logits only, never on how many rows the batch has. torch's reduction
picks its launch (how many blocks share a row) from the tensor's shape, so its result for a row
moves with the batch (docs/ARCHITECTURE.md, "Deterministic scores"). It also reads the bf16
logits as they are, where torch needed an fp32 copy of them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # columns a program reads per step


@triton.jit
def _log_sum_exp_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    # per lane: the running maximum and the sum of exp(x - maximum) of its columns
    high = tl.full([BLOCK], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * stride + start + cols, mask=mask,
                    other=float("-inf")).to(tl.float32)
        new_high = tl.maximum(high, x)
        seen = new_high > float("-inf")  # a lane that has read no column yet adds nothing
        total = tl.where(seen, total * tl.exp(high - new_high) + tl.exp(x - new_high), 0.0)
        high = new_high
    top = tl.max(high, axis=0)
    total = tl.sum(total * tl.exp(high - top), axis=0)
    tl.store(out_ptr + row, top + tl.log(total))


def log_sum_exp_rows(x: torch.Tensor) -> torch.Tensor:
    """[R, V] logits (any float dtype, unit column stride) → [R] fp32 log-sum-exps."""
    rows, cols = x.shape
    assert x.stride(1) == 1, "columns must be contiguous"
    out = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows:
        _log_sum_exp_kernel[(rows,)](x, out, cols, x.stride(0), BLOCK=BLOCK, num_warps=8)
    return out
