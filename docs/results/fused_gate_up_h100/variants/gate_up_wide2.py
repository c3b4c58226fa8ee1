"""Experiment: the fused gate/up GEMM with one wide accumulator over a weight whose gate and up
rows are interleaved in blocks of BN (one tl.dot of N = 2 BN per K step), vs the shipped fused
kernel and cuBLAS + silu_and_mul."""
import json, os, statistics, torch
import triton, triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor
from flashinfer.activation import silu_and_mul
from gpu_worker.gate_up_silu_kernel import gate_up_silu

@triton.jit(do_not_specialize=["M"])
def wide_kernel(x_desc, w_desc, out_desc, M, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n: tl.constexpr = N // BN
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_m
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_m
    om = pid_m * BM
    acc = tl.zeros((BM, 2 * BN), dtype=tl.float32)
    for k in range(0, K, BK):
        acc = tl.dot(x_desc.load([om, k]), w_desc.load([pid_n * 2 * BN, k]).T, acc)
    g, u = tl.split(tl.permute(tl.reshape(acc.to(tl.bfloat16).to(tl.float32), (BM, 2, BN)), (0, 2, 1)))
    out_desc.store([om, pid_n * BN], (g / (1.0 + tl.exp(-g)) * u).to(tl.bfloat16))

def interleave(w, bn):
    two_i, k = w.shape
    i = two_i // 2
    return torch.stack((w[:i].reshape(i // bn, bn, k), w[i:].reshape(i // bn, bn, k)), 1).reshape(two_i, k).contiguous()

def wide(x, wi, bm, bn, stages, warps, gm=8):
    m, k = x.shape
    n = wi.shape[0] // 2
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    wide_kernel[(triton.cdiv(m, bm) * (n // bn),)](
        TensorDescriptor.from_tensor(x, [bm, 64]), TensorDescriptor.from_tensor(wi, [2 * bn, 64]),
        TensorDescriptor.from_tensor(out, [bm, bn]), m, N=n, K=k, BM=bm, BN=bn, BK=64, GROUP_M=gm,
        num_stages=stages, num_warps=warps)
    return out

def ms(fn, reps=100):
    for _ in range(10): fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        s.record(); fn(); e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)

g = torch.Generator(device="cuda").manual_seed(0)
w = (torch.randn(6144, 1024, generator=g, device="cuda") * 0.02).bfloat16()
rows = []
for m in (32768, 65536):
    x = torch.randn(m, 1024, generator=g, device="cuda").bfloat16()
    ref = silu_and_mul(x @ w.T)
    t_ref, t_shipped = ms(lambda: silu_and_mul(x @ w.T)), ms(lambda: gate_up_silu(x, w))
    t_mm = ms(lambda: x @ w.T)
    print(f"{m:>6} unfused {t_ref:.4f} shipped fused {t_shipped:.4f} ({t_shipped / t_ref:.3f}) matmul {t_mm:.4f}", flush=True)
    for bm, bn, st, wp in [(128, 128, 4, 8), (256, 128, 3, 16), (256, 128, 2, 16), (256, 128, 3, 8), (256, 64, 4, 8), (128, 128, 3, 4), (128, 128, 5, 8)]:
        try:
            wi = interleave(w, bn)
            out = wide(x, wi, bm, bn, st, wp)
            same = (out == ref).float().mean().item()
            t = ms(lambda: wide(x, wi, bm, bn, st, wp))
            r = {"rows": m, "bm": bm, "bn": bn, "stages": st, "warps": wp, "ms": t, "ratio": t / t_ref,
                 "shipped_ratio": t_shipped / t_ref, "unfused_ms": t_ref, "matmul_ms": t_mm, "identical": same}
            print(f"       wide {bm}x2*{bn} s{st} w{wp}: {t:.4f} ({t / t_ref:.3f}) identical {same:.5f}", flush=True)
        except Exception as e:
            r = {"rows": m, "bm": bm, "bn": bn, "error": repr(e)[:300]}
            print("       error", bm, bn, repr(e)[:300], flush=True)
        rows.append(r)
json.dump({"gpu": torch.cuda.get_device_name(), "command": "python3 .device/gate_up_wide.py", "rows": rows},
          open(os.path.join(os.environ.get("OUT", "."), "gate_up_wide2.json"), "w"), indent=1)
