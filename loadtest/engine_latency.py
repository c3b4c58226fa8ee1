"""Latency of one lone request in the engine, per request shape: wall time and GPU time.

Usage: python -m loadtest.engine_latency [--repeats 30] [--precision bf16|fp8]
       [--out docs/results/engine_latency.json]
The engine is built from configs/score-gpu.yaml, once with CUDA graphs off (eager) and once with
them on (same weights); each request is packed the way the ingress packs
it (`pack_request`, so an empty query gives one plain sequence per item) and run alone through
`Engine.launch` + `finish`. Wall: median over the repeats, host preparation included; launch:
median host time until `launch` returns (the GPU cannot start before). Kernel:
the CUDA kernels' own time per step from the torch profiler (a launch-bound step has far less
kernel time than wall time). A request with an empty query is also run packed as one multi-item
sequence (`pack_multi_item`, the packing before plain sequences were used for it), for
comparison. `--host-profile` also prints where the host time of a graph launch of the
10 × 300 shape goes (cProfile). Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_worker.forward.engine import Engine
from ranker_contract.config import EngineConfig
from ranker_contract.packing import PackedSequence, pack_multi_item, pack_request
from tools import RESULTS_DIR
from tools.configs import shipped_app_config
from tools.workload import RequestFactory, Workload

CONFIG = "score-gpu.yaml"
# (query tokens, items, tokens per item): the bench shape, a lone item, the no-query shape of
# `loadgen single`, a large request, and a short query.
SHAPES = [(120, 10, 180), (0, 1, 300), (0, 10, 300), (120, 50, 200), (20, 20, 100)]


def wall_and_launch_ms(engine: Engine, batch: tuple[list[PackedSequence], list[list[int]]],
                       repeats: int) -> tuple[float, float]:
    """Median wall ms and launch ms of `repeats` lone steps of `batch` (sequences, label ids per
    sequence), after 3 warm-up steps."""
    for _ in range(3):
        engine.finish(engine.launch(*batch))
    walls, launches = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step = engine.launch(*batch)
        t1 = time.perf_counter()
        engine.finish(step)
        walls.append((time.perf_counter() - t0) * 1e3)
        launches.append((t1 - t0) * 1e3)
    return statistics.median(walls), statistics.median(launches)


def measure(engine: Engine, batch: tuple[list[PackedSequence], list[list[int]]],
            repeats: int) -> tuple[float, float, float]:
    """wall_and_launch_ms, and kernel ms per step."""
    wall_ms, launch_ms = wall_and_launch_ms(engine, batch, repeats)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            engine.finish(engine.launch(*batch))
    kernel_us = sum(e.self_device_time_total for e in prof.key_averages())
    return wall_ms, launch_ms, kernel_us / 5 / 1e3


def host_profile(engine: Engine, batch: tuple[list[PackedSequence], list[list[int]]]) -> None:
    """Print the functions that take the host time of 20 graph launches."""
    import cProfile
    import pstats

    for _ in range(3):
        engine.finish(engine.launch(*batch))
    prof = cProfile.Profile()
    for _ in range(20):
        prof.enable()
        step = engine.launch(*batch)
        prof.disable()
        engine.finish(step)
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "engine_latency.json")
    p.add_argument("--host-profile", action="store_true")
    p.add_argument("--precision", choices=("bf16", "fp8"), default="bf16")
    args = p.parse_args()
    app = shipped_app_config(CONFIG)
    engine_cfg = app.engine.model_copy(update={"precision": args.precision})

    def graphs(enabled: bool) -> EngineConfig:
        return engine_cfg.model_copy(update={"cuda_graphs": engine_cfg.cuda_graphs.model_copy(
            update={"enabled": enabled})})

    eager = Engine.from_config(app.resolved_model_path(), graphs(False))
    started = time.perf_counter()
    modes = [("eager", eager), ("graphs", Engine(eager.model, eager.device, graphs(True)))]
    capture_s = time.perf_counter() - started
    rows = []
    for (query_len, items, item_len), (mode, engine) in itertools.product(
            SHAPES, modes):
        workload = Workload(query_len=query_len, items=items, item_len=item_len)
        query, item_ids = RequestFactory(workload, seed=0).token_ids()
        packings = {"request": pack_request(
            query, item_ids, item_first=False, delimiter_id=0,
            max_seq_tokens=app.limits.max_seq_tokens, max_context=32768)}
        if not query:
            packings["multi-item"] = [pack_multi_item(query, item_ids, 0)]
        for packing, sequences in packings.items():
            batch = (sequences, [list(workload.labels)] * len(sequences))
            wall_ms, launch_ms, kernel_ms = measure(engine, batch, args.repeats)
            if (args.host_profile and mode == "graphs" and packing == "request"
                    and (query_len, items, item_len) == (0, 10, 300)):
                host_profile(engine, batch)
            rows.append({"query_len": query_len, "items": items, "item_len": item_len,
                         "mode": mode, "packing": packing, "sequences": len(sequences),
                         "tokens": sum(s.num_tokens for s in sequences),
                         "wall_ms": round(wall_ms, 2), "launch_ms": round(launch_ms, 2),
                         "kernel_ms": round(kernel_ms, 2)})
    out = {"rows": rows, "repeats": args.repeats, "graph_capture_s": round(capture_s, 2),
           "gpu": torch.cuda.get_device_name(),
           "command": "python -m loadtest.engine_latency " + " ".join(sys.argv[1:]),
           "engine": engine_cfg.model_dump()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"CUDA graphs captured in {capture_s:.1f} s")
    print(f"{'request':>18s} {'mode':>6s} {'packing':>10s} {'seqs':>5s} {'tokens':>7s} "
          f"{'wall ms':>8s} {'launch ms':>9s} {'kernel ms':>9s}")
    for r in rows:
        shape = f"{r['query_len']} + {r['items']} x {r['item_len']}"
        print(f"{shape:>18s} {r['mode']:>6s} {r['packing']:>10s} {r['sequences']:5d} "
              f"{r['tokens']:7d} {r['wall_ms']:8.2f} {r['launch_ms']:9.2f} {r['kernel_ms']:9.2f}")

if __name__ == "__main__":
    main()
