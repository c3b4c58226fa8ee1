"""Fused gate_up GEMM + SwiGLU (gpu_worker/gate_up_silu_kernel.py) vs cuBLAS + silu_and_mul.

Qwen3-0.6B MLP shape (hidden 1024, intermediate 3072, bf16). Checks the fused kernel against the
unfused path (FlashInfer silu_and_mul when it imports, else the same maths in torch), times both
and the whole MLP, prints a table and writes $OUT/fused_mlp.json when OUT is set.
Run from the repo root on a GPU:  python3 .device/fused_mlp_bench.py
"""
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import triton  # noqa: E402

from gpu_worker.gate_up_silu_kernel import _gate_up_silu_kernel, gate_up_silu  # noqa: E402

H, I = 1024, 3072
DEV = torch.device("cuda")
DT = torch.bfloat16


def torch_silu_and_mul(gu: torch.Tensor) -> torch.Tensor:
    g, u = gu.chunk(2, -1)
    return (F.silu(g.float()) * u.float()).to(gu.dtype)


try:
    from flashinfer.activation import silu_and_mul
    REF = "flashinfer.activation.silu_and_mul"
except Exception as exc:  # noqa: BLE001
    print(f"flashinfer unavailable ({exc!r:.120}); reference = torch silu*mul in fp32")
    silu_and_mul, REF = torch_silu_and_mul, "torch"


def reference(x, w):
    return silu_and_mul(x @ w.T)


def cuda_ms(fn, reps=50, warmup=10):
    """Median of per-rep CUDA-event times (ms)."""
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


def weights(seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    w_gu = (torch.randn(2 * I, H, generator=g, device=DEV) * 0.02).to(DT)
    w_down = (torch.randn(H, I, generator=g, device=DEV) * 0.02).to(DT)
    return w_gu, w_down


def inputs(m, seed=1):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(m, H, generator=g, device=DEV).to(DT)


def best_config():
    cfg = getattr(_gate_up_silu_kernel, "best_config", None)  # the last call's config
    if cfg is None:
        return None
    k = cfg.kwargs
    return (f"BM{k['BLOCK_M']} BN{k['BLOCK_N']} BK{k['BLOCK_K']} G{k['GROUP_M']} "
            f"s{cfg.num_stages} w{cfg.num_warps}")


def main():
    props = torch.cuda.get_device_properties(0)
    res = {"device": props.name, "torch": torch.__version__, "triton": triton.__version__,
           "reference": REF, "H": H, "I": I, "correctness": [], "speed": [], "mlp": []}
    print(f"{props.name}  torch {torch.__version__}  triton {triton.__version__}  ref: {REF}")
    w_gu, w_down = weights()

    # 1. Correctness (also vs an fp32-accumulated truth, to show neither side is the worse one).
    print("\n== correctness: fused vs reference ==")
    print(f"{'M':>6} {'max|d|':>10} {'frac!=':>9} {'max|fused-f32|':>15} {'max|ref-f32|':>13} "
          f"{'max|ref-torch|':>15} config")
    for m in (1, 7, 300, 3000, 8192 + 5):
        x = inputs(m)
        out, ref = gate_up_silu(x, w_gu), reference(x, w_gu)
        torch.cuda.synchronize()
        cfg = best_config()
        gu32 = x.float() @ w_gu.float().T  # TF32 off by default for fp32 matmul in torch
        truth = F.silu(gu32[:, :I]) * gu32[:, I:]
        d = (out.float() - ref.float()).abs()
        row = {"M": m, "max_abs_diff": d.max().item(), "frac_diff": (d > 0).float().mean().item(),
               "fused_vs_fp32": (out.float() - truth).abs().max().item(),
               "ref_vs_fp32": (ref.float() - truth).abs().max().item(),
               "ref_vs_torch_ref": (ref.float() - torch_silu_and_mul(x @ w_gu.T).float()).abs()
               .max().item(),
               "shape_ok": tuple(out.shape) == (m, I), "config": cfg}
        res["correctness"].append(row)
        print(f"{m:>6} {row['max_abs_diff']:>10.3e} {row['frac_diff']:>9.2e} "
              f"{row['fused_vs_fp32']:>15.3e} {row['ref_vs_fp32']:>13.3e} "
              f"{row['ref_vs_torch_ref']:>15.3e} {cfg}")
    assert gate_up_silu(inputs(0), w_gu).shape == (0, I)

    # CUDA-graph smoke test: warm (autotuned) kernel captured and replayed on new data.
    try:
        x = inputs(3000, seed=5)
        gate_up_silu(x, w_gu)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = gate_up_silu(x, w_gu)
        x.copy_(inputs(3000, seed=6))
        graph.replay()
        torch.cuda.synchronize()
        d = (y.float() - reference(x, w_gu).float()).abs()
        res["cuda_graph_max_abs_diff"] = d.max().item()
    except Exception as exc:  # noqa: BLE001
        res["cuda_graph_error"] = repr(exc)[:300]
    print(f"cuda graph replay: {res.get('cuda_graph_max_abs_diff', res.get('cuda_graph_error'))}")

    # 2. Speed of gate_up + SwiGLU.
    print("\n== gate_up + SwiGLU (ms, median of 50) ==")
    print(f"{'M':>6} {'ref':>8} {'fused':>8} {'matmul':>8} {'fused/ref':>9} {'TFLOP/s':>8} config")
    for m in (3000, 16384, 32768, 65536):
        x = inputs(m)
        gate_up_silu(x, w_gu)  # autotune this M bucket
        torch.cuda.synchronize()
        cfg = best_config()
        t_ref = cuda_ms(lambda: reference(x, w_gu))
        t_fused = cuda_ms(lambda: gate_up_silu(x, w_gu))
        t_mm = cuda_ms(lambda: x @ w_gu.T)
        tflops = 2 * m * H * 2 * I / t_fused / 1e9
        row = {"M": m, "ref_ms": t_ref, "fused_ms": t_fused, "matmul_ms": t_mm,
               "fused_over_ref": t_fused / t_ref, "fused_tflops": tflops, "config": cfg}
        res["speed"].append(row)
        print(f"{m:>6} {t_ref:>8.4f} {t_fused:>8.4f} {t_mm:>8.4f} {t_fused / t_ref:>9.3f} "
              f"{tflops:>8.1f} {cfg}")
        del x

    # 3. Whole MLP: gate_up + SwiGLU + down_proj.
    print("\n== whole MLP incl. down_proj (ms) ==")
    print(f"{'M':>6} {'ref':>8} {'fused':>8} {'fused/ref':>9} {'max|d|':>10}")
    for m in (32768, 65536):
        x = inputs(m)
        ref_mlp = lambda: reference(x, w_gu) @ w_down.T  # noqa: E731
        fused_mlp = lambda: gate_up_silu(x, w_gu) @ w_down.T  # noqa: E731
        d = (ref_mlp().float() - fused_mlp().float()).abs().max().item()
        t_ref, t_fused = cuda_ms(ref_mlp), cuda_ms(fused_mlp)
        res["mlp"].append({"M": m, "ref_ms": t_ref, "fused_ms": t_fused,
                           "fused_over_ref": t_fused / t_ref, "max_abs_diff": d})
        print(f"{m:>6} {t_ref:>8.4f} {t_fused:>8.4f} {t_fused / t_ref:>9.3f} {d:>10.3e}")
        del x

    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "fused_mlp.json"), "w") as f:
            json.dump(res, f, indent=1)
        print(f"\nwrote {os.path.join(out_dir, 'fused_mlp.json')}")


if __name__ == "__main__":
    main()
