"""The MLP's gate/up projection and SwiGLU in one Triton GEMM: out = silu(x W_gate^T) * (x W_up^T).

Each program computes the gate and the up tile for the same output columns (two fp32
accumulators over one shared x tile), applies SiLU-and-multiply in registers and writes only the
[M, I] result. Unfused, cuBLAS writes the bf16 [M, 2I] gate_up tensor and a separate silu_and_mul
kernel reads it back and writes [M, I]: two memory-bound passes this saves. The weight is the
packed nn.Linear `gate_up_proj` weight ([2I, K]: gate rows, then up rows), unchanged.
GPU only (runs under TRITON_INTERPRET=1 for testing).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BLOCK_K = 64  # every config uses it; gate_up_silu asserts K % BLOCK_K == 0 (no K masks)


def _configs() -> list[triton.Config]:
    if os.environ.get("TRITON_INTERPRET") == "1":  # one config: the interpreter skips tuning
        return [triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": BLOCK_K, "GROUP_M": 8})]
    # Hopper: a program's work is BLOCK_M x (2 * BLOCK_N); 128 x 128 (two 128 x 128 fp32
    # accumulators) is the register-heavy end, 64 x 64 the small-M end.
    shapes = [  # BLOCK_M, BLOCK_N, num_stages, num_warps
        (128, 64, 4, 4), (128, 64, 4, 8), (128, 64, 3, 8), (128, 128, 3, 8),
        (128, 128, 4, 8), (64, 128, 4, 4), (64, 64, 4, 4), (64, 64, 3, 4),
    ]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": BLOCK_K, "GROUP_M": 8},
                          num_stages=s, num_warps=w) for bm, bn, s, w in shapes]


@triton.autotune(configs=_configs(), key=["M_BUCKET", "N", "K"])
@triton.jit
def _gate_up_silu_kernel(x_ptr, w_ptr, out_ptr, M, M_BUCKET, N: tl.constexpr, K: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr):
    # Grouped ordering: GROUP_M row tiles sweep the N tiles together, so their x rows and the
    # weight tiles stay in L2.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_m
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Out-of-range rows/columns wrap onto valid ones (unmasked loads pipeline better); the store
    # is masked. int64: M * K and M * N may pass 2**31.
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    a_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    g_ptrs = w_ptr + cols[None, :] * K + offs_k[:, None]  # [BLOCK_K, BLOCK_N]: W_gate^T
    u_ptrs = g_ptrs + N * K  # W_up^T: rows I + n of the packed weight

    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs)
        acc_g = tl.dot(a, tl.load(g_ptrs), acc_g)
        acc_u = tl.dot(a, tl.load(u_ptrs), acc_u)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K

    # Round gate and up to the activation dtype (bf16) first, as the unfused path does (cuBLAS
    # writes bf16 gate_up; silu_and_mul then works in fp32), to match it as closely as possible.
    out_ty = out_ptr.dtype.element_ty
    g = acc_g.to(out_ty).to(tl.float32)
    u = acc_u.to(out_ty).to(tl.float32)
    h = g / (1.0 + tl.exp(-g)) * u
    out_offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(out_ptr + out_offs, h.to(out_ty), mask=mask)


def _m_bucket(m: int) -> int:
    """The autotune key for M: powers of two from 16 to 65536."""
    return min(max(triton.next_power_of_2(m), 16), 1 << 16)


def gate_up_silu(
    x: torch.Tensor,  # [M, K], contiguous
    weight: torch.Tensor,  # [2I, K], contiguous: gate_up_proj.weight (gate rows, then up rows)
) -> torch.Tensor:
    """silu(x @ weight[:I].T) * (x @ weight[I:].T) as [M, I] in x's dtype, without the [M, 2I].

    Graph-safe once warm: no host syncs; the only allocation is the output. The first call per
    (M bucket, I, K) autotunes (syncs, benchmarks), so warm each bucket before capturing.
    """
    m, k = x.shape
    n2, k_w = weight.shape
    n = n2 // 2
    assert k_w == k and n2 == 2 * n, (x.shape, weight.shape)
    assert k % BLOCK_K == 0 and n % 64 == 0, (k, n)
    assert x.is_contiguous() and weight.is_contiguous() and x.dtype == weight.dtype
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m:
        grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
        _gate_up_silu_kernel[grid](x, weight, out, m, _m_bucket(m), N=n, K=k)
    return out
