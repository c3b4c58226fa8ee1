"""One Triton kernel that makes the fused QKV projection attention-ready, in place.

Per token it normalises each q and k head (Qwen3's q_norm / k_norm; skipped for Llama/Qwen2) and
applies RoPE at the token's packed position from an fp32 cos/sin cache (rotate-half
convention), writing back into the same [T, (Hq + 2 Hk) D] buffer. q, k and v are then strided
views of that buffer, and k and v share one stride, as FlashInfer's paged kernel wants. This
replaces two strided copies, two RMSNorm launches and a RoPE launch per layer with one kernel
(docs/ARCHITECTURE.md, "Engine": the fused element-wise ops). GPU only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _norm_rope_heads(row, heads, n_heads: tl.constexpr, d, half: tl.constexpr, cos, sin,
                     w_ptr, eps, HAS_NORM: tl.constexpr):
    mask = (heads < n_heads)[:, None]
    offs = heads[:, None] * (2 * half) + d[None, :]
    x1 = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + offs + half, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        mean_sq = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * half)
        scale = tl.rsqrt(mean_sq + eps)[:, None]
        x1 = x1 * scale * tl.load(w_ptr + d).to(tl.float32)[None, :]
        x2 = x2 * scale * tl.load(w_ptr + half + d).to(tl.float32)[None, :]
    out_ty = row.dtype.element_ty
    tl.store(row + offs, (x1 * cos[None, :] - x2 * sin[None, :]).to(out_ty), mask=mask)
    tl.store(row + offs + half, (x2 * cos[None, :] + x1 * sin[None, :]).to(out_ty), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, pos_ptr, cos_sin_ptr, q_w_ptr, k_w_ptr, eps,
                         HQ: tl.constexpr, HK: tl.constexpr, HQ_P: tl.constexpr,
                         HK_P: tl.constexpr, D: tl.constexpr, HAS_NORM: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    half: tl.constexpr = D // 2
    d = tl.arange(0, half)
    pos = tl.load(pos_ptr + t)
    cos = tl.load(cos_sin_ptr + pos * D + d)
    sin = tl.load(cos_sin_ptr + pos * D + half + d)
    row = qkv_ptr + t * ((HQ + 2 * HK) * D)
    _norm_rope_heads(row, tl.arange(0, HQ_P), HQ, d, half, cos, sin, q_w_ptr, eps, HAS_NORM)
    _norm_rope_heads(row + HQ * D, tl.arange(0, HK_P), HK, d, half, cos, sin, k_w_ptr, eps,
                     HAS_NORM)


def qkv_prepare(
    qkv: torch.Tensor,  # [T, (Hq + 2 Hk) * D], contiguous; rewritten in place
    positions: torch.Tensor,  # [T] int64
    cos_sin_cache: torch.Tensor,  # [max_positions, D] fp32: cos half, then sin half
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k and v [T, Hk, D]: views of `qkv` after normalising and rotating q, k."""
    t = qkv.shape[0]
    has_norm = q_norm_weight is not None
    if t:
        _qk_norm_rope_kernel[(t,)](
            qkv, positions, cos_sin_cache,
            q_norm_weight if has_norm else cos_sin_cache,  # unused without the norm
            k_norm_weight if has_norm else cos_sin_cache,
            eps,
            HQ=num_heads, HK=num_kv_heads, HQ_P=triton.next_power_of_2(num_heads),
            HK_P=triton.next_power_of_2(num_kv_heads), D=head_dim, HAS_NORM=has_norm,
        )
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q = qkv[:, :q_size].view(t, num_heads, head_dim)
    k = qkv[:, q_size:q_size + kv_size].view(t, num_kv_heads, head_dim)
    v = qkv[:, q_size + kv_size:].view(t, num_kv_heads, head_dim)
    return q, k, v
