"""Experiment: TMA / persistent variants of the fused gate_up + SiLU GEMM vs cuBLAS + silu_and_mul.
Run from the repo root on a GPU: python3 .device/fused_variants.py"""
import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gpu_worker.gate_up_silu_kernel import gate_up_silu  # noqa: E402

H, I = 1024, 3072
DEV = torch.device("cuda")
DT = torch.bfloat16
NUM_SMS = torch.cuda.get_device_properties(0).multi_processor_count


def _set_blocks(nargs):
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["x_desc"].block_shape = [bm, bk]
    nargs["w_desc"].block_shape = [bn, bk]
    nargs["out_desc"].block_shape = [bm, bn]


def _cfgs(persistent):
    out = []
    for bm, bn, s, w in [(128, 128, 3, 8), (128, 128, 4, 8), (128, 64, 4, 4), (128, 64, 4, 8),
                         (256, 64, 3, 8), (64, 128, 4, 4), (128, 128, 4, 4)]:
        for g in (8,):
            out.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": g},
                                     num_stages=s, num_warps=w, pre_hook=_set_blocks))
    return out


@triton.jit
def _tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    group = tile_id // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % (GROUP_M * num_pid_n)) % group_m
    pid_n = (tile_id % (GROUP_M * num_pid_n)) // group_m
    return pid_m, pid_n


@triton.jit
def _epilogue(acc_g, acc_u, out_desc, om, on):
    out_ty: tl.constexpr = tl.bfloat16
    g = acc_g.to(out_ty).to(tl.float32)
    u = acc_u.to(out_ty).to(tl.float32)
    out_desc.store([om, on], (g / (1.0 + tl.exp(-g)) * u).to(out_ty))


@triton.autotune(configs=_cfgs(False), key=["M_BUCKET"])
@triton.jit(do_not_specialize=["M", "M_BUCKET"])
def tma_kernel(x_desc, w_desc, out_desc, M, M_BUCKET, N: tl.constexpr, K: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n: tl.constexpr = N // BLOCK_N
    pid_m, pid_n = _tile(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    om, on = pid_m * BLOCK_M, pid_n * BLOCK_N
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = x_desc.load([om, k])
        acc_g = tl.dot(a, w_desc.load([on, k]).T, acc_g)
        acc_u = tl.dot(a, w_desc.load([N + on, k]).T, acc_u)
    _epilogue(acc_g, acc_u, out_desc, om, on)


def make_persistent(ws):
    @triton.autotune(configs=_cfgs(True), key=["M_BUCKET"])
    @triton.jit(do_not_specialize=["M", "M_BUCKET"])
    def kernel(x_desc, w_desc, out_desc, M, M_BUCKET, N: tl.constexpr, K: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, WS: tl.constexpr):
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n: tl.constexpr = N // BLOCK_N
        num_tiles = num_pid_m * num_pid_n
        for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True,
                                warp_specialize=WS):
            pid_m, pid_n = _tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
            om, on = pid_m * BLOCK_M, pid_n * BLOCK_N
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(0, K, BLOCK_K):
                a = x_desc.load([om, k])
                acc_g = tl.dot(a, w_desc.load([on, k]).T, acc_g)
                acc_u = tl.dot(a, w_desc.load([N + on, k]).T, acc_u)
            _epilogue(acc_g, acc_u, out_desc, om, on)
    return kernel


def descs(x, w, out):
    dummy = [64, 64]
    return (TensorDescriptor.from_tensor(x, dummy), TensorDescriptor.from_tensor(w, dummy),
            TensorDescriptor.from_tensor(out, dummy))


def bucket(m):
    return min(max(triton.next_power_of_2(m), 16), 1 << 16)


def run_tma(x, w):
    m = x.shape[0]
    out = torch.empty((m, I), device=x.device, dtype=x.dtype)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * (I // meta["BLOCK_N"]),)
    tma_kernel[grid](*descs(x, w, out), m, bucket(m), N=I, K=H)
    return out


PERSISTENT = {False: make_persistent(False), True: make_persistent(True)}


def run_persistent(ws):
    kern = PERSISTENT[ws]

    def run(x, w):
        m = x.shape[0]
        out = torch.empty((m, I), device=x.device, dtype=x.dtype)
        grid = lambda meta: (min(NUM_SMS, triton.cdiv(m, meta["BLOCK_M"]) * (I // meta["BLOCK_N"])),)
        kern[grid](*descs(x, w, out), m, bucket(m), N=I, K=H, NUM_SMS=NUM_SMS, WS=ws)
        return out
    return run, kern


def cuda_ms(fn, reps=50, warmup=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)


def main():
    from flashinfer.activation import silu_and_mul
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    g = torch.Generator(device=DEV).manual_seed(0)
    w = (torch.randn(2 * I, H, generator=g, device=DEV) * 0.02).to(DT)
    variants = {"plain (helper)": (gate_up_silu, None), "tma": (run_tma, tma_kernel)}
    for ws in (False, True):
        run, kern = run_persistent(ws)
        variants[f"persistent ws={ws}"] = (run, kern)
    res = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
    print(f"{res['gpu']} triton {triton.__version__}")
    print(f"{'M':>6} {'variant':>20} {'ms':>8} {'ref ms':>8} {'mm ms':>8} {'ratio':>6} {'max|d|':>9} config")
    for m in (3000, 16384, 32768, 65536):
        x = torch.randn(m, H, generator=g, device=DEV).to(DT)
        ref = silu_and_mul(x @ w.T)
        t_ref = cuda_ms(lambda: silu_and_mul(x @ w.T))
        t_mm = cuda_ms(lambda: x @ w.T)
        for name, (fn, kern) in variants.items():
            try:
                out = fn(x, w)
                torch.cuda.synchronize()
                d = (out.float() - ref.float()).abs().max().item()
                t = cuda_ms(lambda: fn(x, w))
                cfg = getattr(kern, "best_config", None)
                cfg = cfg and (f"{cfg.kwargs['BLOCK_M']}x{cfg.kwargs['BLOCK_N']} "
                               f"s{cfg.num_stages} w{cfg.num_warps}")
                row = {"M": m, "variant": name, "ms": t, "ref_ms": t_ref, "matmul_ms": t_mm,
                       "ratio": t / t_ref, "max_abs_diff": d, "config": cfg}
                print(f"{m:>6} {name:>20} {t:>8.4f} {t_ref:>8.4f} {t_mm:>8.4f} {t / t_ref:>6.3f} "
                      f"{d:>9.2e} {cfg}", flush=True)
            except Exception as exc:  # noqa: BLE001
                row = {"M": m, "variant": name, "error": repr(exc)[:400]}
                print(f"{m:>6} {name:>20} ERROR {repr(exc)[:300]}", flush=True)
            res["rows"].append(row)
    if os.environ.get("OUT"):
        json.dump(res, open(os.path.join(os.environ["OUT"], "fused_variants.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
