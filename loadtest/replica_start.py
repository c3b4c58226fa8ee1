"""Where a scorer replica's start goes, phase by phase, in a fresh process (GPU).

Usage: python -m loadtest.replica_start [--config score-gpu.yaml] [--out FILE]

Runs the steps of ScoreWorker.__init__ (gpu_worker/deployment.py) one at a time and times each:
importing torch, the CUDA context, importing flashinfer, reading the weights onto the GPU, the
engine's ops and attention, the CUDA-graph capture, and the warm-up probe that measures the batch
budget (its first run compiles or loads every kernel). Run it twice on one machine to see what the
on-disk kernel caches (Triton, FlashInfer JIT) save a second replica. Ray Serve's own part (the
actor process, importing ray, the replica's registration) is not in here. Prints one line per
phase; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

STARTED = time.perf_counter()


def main() -> None:
    from tools import RESULTS_DIR

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="score-gpu.yaml")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "replica_start.json")
    args = p.parse_args()
    phases: dict[str, float] = {}
    mark = time.perf_counter()

    def done(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name] = round(now - mark, 3)
        mark = now

    import torch
    done("import torch")
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    done("CUDA context")
    import flashinfer  # noqa: F401
    done("import flashinfer")

    from gpu_worker.engine import Engine
    from gpu_worker.loader import load_model
    from tools.configs import shipped_app_config
    app = shipped_app_config(args.config)
    done("import the engine")
    device = torch.device("cuda")
    model = load_model(app.resolved_model_path(), getattr(torch, app.engine.dtype), device,
                       app.engine.precision, app.engine.dequantize_fp8_checkpoint)
    torch.cuda.synchronize()
    done("weights onto the GPU")
    engine = Engine(model, device, app.engine.model_copy(update={"cuda_graphs": False}))
    done("ops and attention")
    if app.engine.cuda_graphs:
        from gpu_worker.graphs import CudaGraphs
        engine.graphs = CudaGraphs(model, engine.ops, list(app.engine.cuda_graph_buckets),
                                   app.engine.flashinfer_backend, device)
        done("CUDA-graph capture")
    engine.measure_budget(app.scheduler.max_batch_tokens, app.limits.max_seq_tokens)
    done("warm-up probe (kernel compile/load)")
    total = time.perf_counter() - STARTED
    out = {"phases_s": phases, "total_s": round(total, 3), "gpu": torch.cuda.get_device_name(),
           "command": "python -m loadtest.replica_start " + " ".join(sys.argv[1:])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    for name, s in phases.items():
        print(f"{name:>38s} {s:7.2f} s")
    print(f"{'total (interpreter start excluded)':>38s} {total:7.2f} s")


if __name__ == "__main__":
    main()
