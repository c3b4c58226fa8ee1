"""Tile sweep of the fused QKV GEMM (gpu_worker/qkv_gemm_kernel.py) vs cuBLAS + qkv_prepare."""
import json, os, statistics, torch
import torch.nn.functional as F
import qkv_gemm_kernel as K  # this folder (not in gpu_worker: it did not pay)
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
kw = qw.flip(0).contiguous()
p = torch.arange(40960, dtype=torch.float32, device="cuda")[:, None]
inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, device="cuda").float() / D))
cache = torch.cat(((p * inv).cos(), (p * inv).sin()), -1)
rows = []
for m in (8192, 32768, 65536):
    x = torch.randn(m, H, generator=g, device="cuda").bfloat16()
    pos = torch.randint(0, 4096, (m,), generator=g, device="cuda")
    def unfused():
        qkv = F.linear(x, w); qkv_prepare(qkv, pos, cache, HQ, HK, D, qw, kw, 1e-6); return qkv
    t_ref, t_mm = ms(unfused), ms(lambda: F.linear(x, w))
    for bm, st, wp, gm in [(128, 3, 8, 8), (128, 4, 4, 8), (64, 4, 4, 8), (256, 3, 8, 8), (128, 4, 8, 16), (64, 3, 4, 16)]:
        K.BLOCK_M, K.NUM_STAGES, K.NUM_WARPS, K.GROUP_M = bm, st, wp, gm
        try:
            f = lambda: K.qkv_norm_rope(x, w, pos, cache, HQ, HK, D, qw, kw, 1e-6)
            same = (f() == unfused()).float().mean().item()
            t = ms(f)
            r = {"rows": m, "block_m": bm, "stages": st, "warps": wp, "group_m": gm, "fused_ms": t,
                 "unfused_ms": t_ref, "matmul_ms": t_mm, "ratio": t / t_ref, "identical": same}
        except Exception as e:
            r = {"rows": m, "block_m": bm, "stages": st, "warps": wp, "error": repr(e)[:200]}
        rows.append(r)
        print(r, flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "command": "python3 .device/qkv_sweep.py", "rows": rows},
          open(os.path.join(os.environ.get("OUT", "."), "qkv_sweep.json"), "w"), indent=1)
