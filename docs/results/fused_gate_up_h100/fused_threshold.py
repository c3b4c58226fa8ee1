"""Fused gate/up (gpu_worker/gate_up_silu_kernel.py) vs cuBLAS + silu_and_mul by batch rows."""
import json, os, statistics, torch
from flashinfer.activation import silu_and_mul
from gpu_worker.gate_up_silu_kernel import gate_up_silu
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
for m in (2048, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 65536):
    x = torch.randn(m, 1024, generator=g, device="cuda").bfloat16()
    a = ms(lambda: silu_and_mul(x @ w.T)); b = ms(lambda: gate_up_silu(x, w))
    rows.append({"rows": m, "unfused_ms": a, "fused_ms": b, "ratio": b / a})
    print(f"{m:>6} unfused {a:.4f} fused {b:.4f} ratio {b/a:.3f}", flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "command": "python3 .device/fused_threshold.py", "rows": rows},
          open(os.path.join(os.environ.get("OUT", "."), "fused_threshold.json"), "w"), indent=1)
