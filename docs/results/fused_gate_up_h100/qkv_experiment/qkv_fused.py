"""QKV GEMM with q/k norm + RoPE fused (gpu_worker/qkv_gemm_kernel.py) vs cuBLAS + qkv_prepare."""
import json, os, statistics, torch
import torch.nn.functional as F
from qkv_gemm_kernel import qkv_norm_rope  # this folder
from gpu_worker.qkv_kernel import qkv_prepare
HQ, HK, D, H = 16, 8, 128, 1024
N = (HQ + 2 * HK) * D
def ms(fn, reps=100):
    for _ in range(10): fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        s.record(); fn(); e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)
g = torch.Generator(device="cuda").manual_seed(0)
w = (torch.randn(N, H, generator=g, device="cuda") * 0.02).bfloat16()
qw = (1 + 0.2 * torch.randn(D, generator=g, device="cuda")).bfloat16()
kw = (1 + 0.2 * torch.randn(D, generator=g, device="cuda")).bfloat16()
pos_max = 40960
p = torch.arange(pos_max, dtype=torch.float32, device="cuda")[:, None]
inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, device="cuda").float() / D))
cache = torch.cat(((p * inv).cos(), (p * inv).sin()), -1)
def unfused(x, positions, norm=True):
    qkv = F.linear(x, w)
    qkv_prepare(qkv, positions, cache, HQ, HK, D, qw if norm else None, kw if norm else None, 1e-6)
    return qkv
def fused(x, positions, norm=True):
    return qkv_norm_rope(x, w, positions, cache, HQ, HK, D, qw if norm else None, kw if norm else None, 1e-6)
rows = []
print(f"{'rows':>6} {'norm':>5} {'identical':>9} {'max|d|':>9} {'unfused ms':>10} {'fused ms':>9} {'ratio':>6}")
for m in (1, 300, 2048, 4096, 8192, 16384, 32768, 65536):
    x = torch.randn(m, H, generator=g, device="cuda").bfloat16()
    positions = torch.randint(0, 4096, (m,), generator=g, device="cuda")
    for norm in (True, False) if m in (300, 32768) else (True,):
        a, b = unfused(x, positions, norm).float(), fused(x, positions, norm).float()
        same = (a == b).float().mean().item(); d = (a - b).abs().max().item()
        ta = ms(lambda: unfused(x, positions, norm)) if m >= 2048 else None
        tb = ms(lambda: fused(x, positions, norm)) if m >= 2048 else None
        rows.append({"rows": m, "norm": norm, "identical": same, "max_abs_diff": d,
                     "unfused_ms": ta, "fused_ms": tb, "ratio": tb / ta if ta else None})
        print(f"{m:>6} {str(norm):>5} {same:>9.5f} {d:>9.2e} {ta or 0:>10.4f} {tb or 0:>9.4f} {(tb / ta) if ta else 0:>6.3f}", flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "command": "python3 .device/qkv_fused.py", "rows": rows},
          open(os.path.join(os.environ.get("OUT", "."), "qkv_fused.json"), "w"), indent=1)
