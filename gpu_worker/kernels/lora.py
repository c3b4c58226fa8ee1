"""A batch of several LoRA adapters through a decoder linear in two Triton kernels: no gather, no
copy of x or W, and no second pass over the output (or, where the output is the narrower
tensor, a second pass over it in place of a GEMM of its own).

`lora_shrink`: t = x Aᵀ with each row's own adapter's A, [M, R] (zeros for rows of the model
alone); it also reads an FP8 linear's quantized rows and their scales as they are.
`lora_linear`: y = x Wᵀ + t Bᵀ, again each row's own B, as one GEMM: the K loop over x and W
is the fused gate/up kernel's (gpu_worker/kernels/gate_up_silu.py: TMA tiles, grouped order, one
fixed tile), then each adapter present in the row tile adds its rows of t times its
B tile (other rows masked to zero) into the same fp32 accumulator before the only store. With
`swiglu` the weight is the packed gate/up and the epilogue applies SiLU-and-multiply, rounding
gate and up to bf16 first, as the unfused path does. A tile meets every adapter between its
rows' smallest and largest slot; the scheduler sorts a batch by adapter, so that is one or two.
Adapters are stacked per linear: A [S, R, K] and B [S, out, R], slot s (1-based) at s - 1, R the
slots' width (gpu_worker/model/lora.py, slot_rank). `lora_add`: y += t Bᵀ in place, each row's
own B, after the base GEMM ran on cuBLAS: for o and down, whose output is narrow (hidden wide),
the fused GEMM's fixed tiles leave half of the SMs idle on a small batch, while one more read
and write of that output is cheap. Their torch reference is LoraLinear's slice path
(gpu_worker/model/lora.py): tests/gpu/test_triton_kernels.py holds the kernels to that path's
distance from float64. Hopper or newer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from gpu_worker.kernels.gate_up_silu import (
    BLOCK_K,
    BLOCK_M,
    BLOCK_N,
    GROUP_M,
    NUM_STAGES,
    NUM_WARPS,
    tile_origin,
)

# Without SwiGLU's second accumulator, one twice as wide: the same registers, the same tile of
# output work per program as the gate/up kernel's.
PLAIN_BLOCK_N = 2 * BLOCK_N
# lora_shrink: one tiling for every batch, so that a row's t does not follow its batch's row
# count (docs/ARCHITECTURE.md, "Deterministic scores"): 64-row blocks, as a large batch's
# memory-bound shrink wants, and K steps of 128 where K allows, which a lone request's graph,
# bound by its K loop's latency, wants long (docs/BENCHMARKS.md, "LoRA adapters")
SHRINK_BLOCK_M, SHRINK_BLOCK_K = 64, 128
ADD_BLOCK_M, ADD_BLOCK_N = 64, 128
NO_SLOT = 1 << 30  # above any slot: a tile without adapter rows loops over none


def fits(out_features: int, in_features: int, swiglu: bool, add: bool = False) -> bool:
    """Whether the kernels' fixed tiles divide this linear's shape (`add`: through lora_add)."""
    if add:
        return out_features % ADD_BLOCK_N == 0
    if swiglu:
        return (out_features // 2) % BLOCK_N == 0 and in_features % BLOCK_K == 0
    return out_features % PLAIN_BLOCK_N == 0 and in_features % BLOCK_K == 0


@triton.jit
def _tile_slots(slot_ptr, rows, M, NO_SLOT: tl.constexpr):
    """A row tile's view of the slots: (rows inside M, each row's slot, 0 past M, and the
    smallest and largest adapter slot among them; first > last: the model's rows alone)."""
    inside = rows < M
    slots = tl.load(slot_ptr + rows, mask=inside, other=0)
    return inside, slots, tl.min(tl.where(slots > 0, slots, NO_SLOT)), tl.max(slots)


@triton.jit(do_not_specialize=["M"])
def _lora_shrink_kernel(x_ptr, a_ptr, t_ptr, slot_ptr, scale_ptr, M, K: tl.constexpr,
                        R: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                        NO_SLOT: tl.constexpr, SCALED: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    inside, slots, first, last = _tile_slots(slot_ptr, rows, M, NO_SLOT)
    r = tl.arange(0, R)
    kk = tl.arange(0, BLOCK_K)
    t = tl.zeros((BLOCK_M, R), dtype=tl.float32)
    for s in range(first, last + 1):
        acc = tl.zeros((BLOCK_M, R), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            x = tl.load(x_ptr + rows[:, None].to(tl.int64) * K + (k + kk)[None, :],
                        mask=inside[:, None], other=0.0)
            a = tl.load(a_ptr + (s - 1) * (R * K) + r[:, None] * K + (k + kk)[None, :])
            acc = tl.dot(x.to(a.dtype), a.T, acc)  # e4m3 to bf16 is exact
        t = tl.where((slots == s)[:, None], acc, t)
    if SCALED:  # (q · scale) Aᵀ = (q Aᵀ) · scale, one scale per row
        t *= tl.load(scale_ptr + rows, mask=inside, other=0.0)[:, None]
    tl.store(t_ptr + rows[:, None].to(tl.int64) * R + r[None, :], t.to(t_ptr.dtype.element_ty),
             mask=inside[:, None])


@triton.jit(do_not_specialize=["M"])
def _lora_linear_kernel(x_desc, w_desc, t_ptr, b_ptr, slot_ptr, bias_ptr, out_ptr, M,
                        N: tl.constexpr, K: tl.constexpr, R: tl.constexpr, W_ROWS: tl.constexpr,
                        SWIGLU: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        NO_SLOT: tl.constexpr):
    om, on = tile_origin(M, N, BLOCK_M, BLOCK_N, GROUP_M)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):  # rows past M load as zeros; the store clips them
        a = x_desc.load([om, k])
        acc = tl.dot(a, w_desc.load([on, k]).T, acc)
        if SWIGLU:
            acc_u = tl.dot(a, w_desc.load([N + on, k]).T, acc_u)

    rows = om + tl.arange(0, BLOCK_M)
    inside, slots, first, last = _tile_slots(slot_ptr, rows, M, NO_SLOT)
    r = tl.arange(0, R)
    n = on + tl.arange(0, BLOCK_N)
    for s in range(first, last + 1):
        t = tl.load(t_ptr + rows[:, None].to(tl.int64) * R + r[None, :],
                    mask=(inside & (slots == s))[:, None], other=0.0)
        b_slot = b_ptr + (s - 1) * (W_ROWS * R)
        acc = tl.dot(t, tl.load(b_slot + n[:, None] * R + r[None, :]).T, acc)
        if SWIGLU:
            acc_u = tl.dot(t, tl.load(b_slot + (N + n)[:, None] * R + r[None, :]).T, acc_u)

    if HAS_BIAS:
        acc += tl.load(bias_ptr + n).to(tl.float32)[None, :]
    if SWIGLU:
        g = acc.to(tl.bfloat16).to(tl.float32)
        u = acc_u.to(tl.bfloat16).to(tl.float32)
        y = g / (1.0 + tl.exp(-g)) * u
    else:
        y = acc
    tl.store(out_ptr + rows[:, None].to(tl.int64) * N + n[None, :], y.to(out_ptr.dtype.element_ty),
             mask=inside[:, None])


@triton.jit(do_not_specialize=["M"])
def _lora_add_kernel(y_ptr, t_ptr, b_ptr, slot_ptr, M, N: tl.constexpr, R: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NO_SLOT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    inside, slots, first, last = _tile_slots(slot_ptr, rows, M, NO_SLOT)
    if first <= last:  # a tile of the model's rows alone is left as it is
        r = tl.arange(0, R)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        at = rows[:, None].to(tl.int64) * N + n[None, :]
        acc = tl.load(y_ptr + at, mask=inside[:, None], other=0.0).to(tl.float32)
        for s in range(first, last + 1):
            t = tl.load(t_ptr + rows[:, None].to(tl.int64) * R + r[None, :],
                        mask=(inside & (slots == s))[:, None], other=0.0)
            b = tl.load(b_ptr + (s - 1) * (N * R) + n[:, None] * R + r[None, :])
            acc = tl.dot(t, b.T, acc)
        tl.store(y_ptr + at, acc.to(y_ptr.dtype.element_ty), mask=inside[:, None])


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor,
                scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] bf16, a [S, R, K] bf16, slots [M] int (0: no adapter) → t [M, R] bf16. With
    `scale`, x is an FP8 linear's input rows (gpu_worker/model/fp8.py): e4m3 [M, K] and fp32 row
    scales [M, 1], read as they are, t being that of the dequantized rows."""
    m, k = x.shape
    r = a.shape[1]
    t = torch.empty((m, r), device=x.device, dtype=a.dtype)
    if m:
        block_k = SHRINK_BLOCK_K if k % SHRINK_BLOCK_K == 0 else BLOCK_K
        _lora_shrink_kernel[(triton.cdiv(m, SHRINK_BLOCK_M),)](
            x, a, t, slots, x if scale is None else scale, m, K=k, R=r, BLOCK_M=SHRINK_BLOCK_M,
            BLOCK_K=block_k, NO_SLOT=NO_SLOT, SCALED=scale is not None, num_stages=4)
    return t


def lora_linear(x: torch.Tensor, weight: torch.Tensor, t: torch.Tensor, b: torch.Tensor,
                slots: torch.Tensor, bias: torch.Tensor | None = None,
                swiglu: bool = False) -> torch.Tensor:
    """x Wᵀ (+ bias) + each row's t Bᵀ, [M, out] bf16; with `swiglu`, SiLU(gate) * up of that,
    [M, out / 2]. x [M, K] and weight [out, K] contiguous bf16; t [M, R]; b [S, out, R]."""
    m, k = x.shape
    rows = weight.shape[0]
    if not fits(rows, k, swiglu):
        raise ValueError(f"lora_linear: weight {tuple(weight.shape)} does not fit the tiles")
    n = rows // 2 if swiglu else rows
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    block_n = BLOCK_N if swiglu else PLAIN_BLOCK_N
    if m:
        grid = (triton.cdiv(m, BLOCK_M) * (n // block_n),)
        _lora_linear_kernel[grid](
            TensorDescriptor.from_tensor(x, [BLOCK_M, BLOCK_K]),
            TensorDescriptor.from_tensor(weight, [block_n, BLOCK_K]),
            t, b, slots, bias if bias is not None else t, out, m,
            N=n, K=k, R=t.shape[1], W_ROWS=rows, SWIGLU=swiglu, HAS_BIAS=bias is not None,
            BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, NO_SLOT=NO_SLOT,
            num_stages=NUM_STAGES, num_warps=NUM_WARPS,
        )
    return out


def lora_add(y: torch.Tensor, t: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> None:
    """y [M, out] bf16 (x Wᵀ, contiguous) += each row's t Bᵀ, in place; t [M, R], b [S, out, R]."""
    m, n = y.shape
    if not fits(n, 0, swiglu=False, add=True):
        raise ValueError(f"lora_add: {n} outputs do not fit the tiles")
    if m:
        _lora_add_kernel[(triton.cdiv(m, ADD_BLOCK_M), n // ADD_BLOCK_N)](
            y, t, b, slots, m, N=n, R=t.shape[1], BLOCK_M=ADD_BLOCK_M, BLOCK_N=ADD_BLOCK_N,
            NO_SLOT=NO_SLOT)
