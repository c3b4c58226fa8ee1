"""The MLP's gate/up projection and SwiGLU in one Triton GEMM: out = silu(x W_gate^T) * (x W_up^T).

Each program computes the gate and the up tile of the same output columns (two fp32 accumulators
over one shared x tile, loaded by TMA), applies SiLU-and-multiply in registers and writes only
the [M, I] result. Unfused, cuBLAS writes the bf16 [M, 2I] gate_up tensor and FlashInfer's
silu_and_mul reads it back and writes [M, I]: two memory-bound passes this saves. The output is
bit-identical to the unfused path (gate and up are rounded to bf16 before the SiLU, as there).
It pays only on large batches, so `CudaOps` uses it from FUSED_GATE_UP_MIN_TOKENS rows
(docs/ARCHITECTURE.md, "Engine"). Hopper or newer (TMA). GPU only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

# One fixed tile (the autotuner's pick for large batches): no tuning at run time, so no host sync
# and no first-call stall per batch size.
BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M = 128, 128, 64, 8
NUM_STAGES, NUM_WARPS = 3, 8


@triton.jit
def tile_origin(M, N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                GROUP_M: tl.constexpr):
    """(first row, first column) of this program's output tile, in grouped order: GROUP_M row
    tiles sweep the N tiles together, so their x rows and the weight tiles stay in L2."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n: tl.constexpr = N // BLOCK_N
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_m
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_m
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@triton.jit(do_not_specialize=["M"])  # one compile, whatever the batch size
def _gate_up_silu_kernel(x_desc, w_desc, out_desc, M, N: tl.constexpr, K: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr):
    om, on = tile_origin(M, N, BLOCK_M, BLOCK_N, GROUP_M)

    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):  # rows past M load as zeros; the store clips them
        a = x_desc.load([om, k])
        acc_g = tl.dot(a, w_desc.load([on, k]).T, acc_g)  # gate: weight rows [0, N)
        acc_u = tl.dot(a, w_desc.load([N + on, k]).T, acc_u)  # up: weight rows [N, 2N)

    g = acc_g.to(tl.bfloat16).to(tl.float32)
    u = acc_u.to(tl.bfloat16).to(tl.float32)
    out_desc.store([om, on], (g / (1.0 + tl.exp(-g)) * u).to(tl.bfloat16))


def gate_up_silu(
    x: torch.Tensor,  # [M, K] bf16, contiguous
    weight: torch.Tensor,  # [2I, K] bf16, contiguous: gate_up_proj.weight (gate rows, then up)
) -> torch.Tensor:
    """silu(x @ weight[:I].T) * (x @ weight[I:].T) as [M, I] bf16, without the [M, 2I]."""
    m, k = x.shape
    n = weight.shape[0] // 2
    if weight.shape != (2 * n, k) or n % BLOCK_N or k % BLOCK_K:
        raise ValueError(f"gate_up_silu: shapes {tuple(x.shape)} x {tuple(weight.shape)} do not "
                         f"fit {BLOCK_N}-wide tiles")
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        raise ValueError("gate_up_silu: bf16 only")
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m:
        grid = (triton.cdiv(m, BLOCK_M) * (n // BLOCK_N),)
        _gate_up_silu_kernel[grid](
            TensorDescriptor.from_tensor(x.contiguous(), [BLOCK_M, BLOCK_K]),
            TensorDescriptor.from_tensor(weight.contiguous(), [BLOCK_N, BLOCK_K]),
            TensorDescriptor.from_tensor(out, [BLOCK_M, BLOCK_N]),
            m, N=n, K=k, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
            num_stages=NUM_STAGES, num_warps=NUM_WARPS,
        )
    return out
