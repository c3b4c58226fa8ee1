"""The QKV projection as one Triton GEMM with q/k RMSNorm and RoPE in its epilogue.

Every output tile is 128 rows × one head (BLOCK_N = head_dim), so a q or k head's norm and its
rotate-half pairs (d, d + D/2) lie inside one tile: the epilogue normalises and rotates it in
registers before the only store. Unfused, cuBLAS writes the [T, (Hq + 2 Hk) D] projection and
gpu_worker/qkv_kernel.py reads q and k back and rewrites them: the pass this saves. The maths
after the GEMM is qkv_kernel's (the projection rounded to bf16 first, as cuBLAS writes it; fp32
norm and rotation from the same cos/sin cache). Hopper or newer (TMA loads). GPU only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

BLOCK_M, BLOCK_K, GROUP_M = 128, 64, 8
NUM_STAGES, NUM_WARPS = 3, 8


@triton.jit(do_not_specialize=["M"])
def _qkv_norm_rope_kernel(x_desc, w_desc, out_desc, pos_ptr, cos_sin_ptr, q_w_ptr, k_w_ptr, eps,
                          M, K: tl.constexpr, HQ: tl.constexpr, HK: tl.constexpr,
                          D: tl.constexpr, HAS_NORM: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Grouped ordering (GROUP_M row tiles sweep the heads together) for L2 reuse.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n: tl.constexpr = HQ + 2 * HK
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_m
    head = (pid % (GROUP_M * num_pid_n)) // group_m
    om, on = pid_m * BLOCK_M, head * D

    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):  # rows past M load as zeros; the store clips them
        acc = tl.dot(x_desc.load([om, k]), w_desc.load([on, k]).T, acc)
    x = acc.to(tl.bfloat16)
    if head < HQ + HK:  # a q or k head: norm, then RoPE at each row's position
        half: tl.constexpr = D // 2
        x1, x2 = tl.split(tl.permute(tl.reshape(x.to(tl.float32), (BLOCK_M, 2, half)), (0, 2, 1)))
        d = tl.arange(0, half)
        if HAS_NORM:
            is_q = head < HQ
            w1 = tl.where(is_q, tl.load(q_w_ptr + d), tl.load(k_w_ptr + d)).to(tl.float32)
            w2 = tl.where(is_q, tl.load(q_w_ptr + half + d),
                          tl.load(k_w_ptr + half + d)).to(tl.float32)
            scale = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps)
            x1 = x1 * scale[:, None] * w1[None, :]
            x2 = x2 * scale[:, None] * w2[None, :]
        rows = om + tl.arange(0, BLOCK_M)
        pos = tl.load(pos_ptr + rows, mask=rows < M, other=0)
        cs = cos_sin_ptr + pos[:, None] * D + d[None, :]
        cos, sin = tl.load(cs), tl.load(cs + half)
        o1 = (x1 * cos - x2 * sin).to(tl.bfloat16)
        o2 = (x2 * cos + x1 * sin).to(tl.bfloat16)
        x = tl.reshape(tl.permute(tl.join(o1, o2), (0, 2, 1)), (BLOCK_M, D))
    out_desc.store([om, on], x)


def qkv_norm_rope(
    x: torch.Tensor,  # [T, hidden] bf16
    weight: torch.Tensor,  # [(Hq + 2 Hk) * D, hidden] bf16: qkv_proj.weight (no bias)
    positions: torch.Tensor,  # [T] int64
    cos_sin_cache: torch.Tensor,  # [max_positions, D] fp32: cos half, then sin half
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """[T, (Hq + 2 Hk) * D] bf16: the projection with q and k normalised and rotated, laid out
    as gpu_worker/qkv_kernel.py leaves it."""
    t, hidden = x.shape
    n = (num_heads + 2 * num_kv_heads) * head_dim
    if weight.shape != (n, hidden) or head_dim not in (64, 128, 256) or hidden % BLOCK_K:
        raise ValueError(f"qkv_norm_rope: shapes {tuple(x.shape)} x {tuple(weight.shape)}, "
                         f"head_dim {head_dim} do not fit its tiles")
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        raise ValueError("qkv_norm_rope: bf16 only")
    out = torch.empty((t, n), device=x.device, dtype=x.dtype)
    if t:
        has_norm = q_norm_weight is not None
        grid = (triton.cdiv(t, BLOCK_M) * (num_heads + 2 * num_kv_heads),)
        _qkv_norm_rope_kernel[grid](
            TensorDescriptor.from_tensor(x.contiguous(), [BLOCK_M, BLOCK_K]),
            TensorDescriptor.from_tensor(weight.contiguous(), [head_dim, BLOCK_K]),
            TensorDescriptor.from_tensor(out, [BLOCK_M, head_dim]),
            positions, cos_sin_cache,
            q_norm_weight if has_norm else cos_sin_cache,  # unused without the norm
            k_norm_weight if has_norm else cos_sin_cache,
            eps, t, K=hidden, HQ=num_heads, HK=num_kv_heads, D=head_dim, HAS_NORM=has_norm,
            BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
            num_stages=NUM_STAGES, num_warps=NUM_WARPS,
        )
    return out
