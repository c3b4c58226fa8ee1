"""Where one engine step's GPU time goes: torch profiler table of CUDA kernels.

Usage: python loadtest/profile_engine.py [--requests 33] [--model models/qwen3-0.6b-random]
Runs the bench workload (120-token query + 10 × 180-token items per request) as one batch,
warms up, profiles 3 steps and prints the top kernels by total CUDA time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpu_worker.engine import Engine, ScoreTask  # noqa: E402
from ranker_contract.config import EngineConfig  # noqa: E402
from loadtest.bench_engine import LABELS, make_requests  # noqa: E402
from ranker_contract.packing import pack_multi_item  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "qwen3-0.6b-random")
    p.add_argument("--requests", type=int, default=33)
    p.add_argument("--rows", type=int, default=25)
    args = p.parse_args()
    engine = Engine.from_config(args.model, EngineConfig(device="cuda", dtype="bfloat16",
                                                         attention="flashinfer", ops="cuda"))
    tasks = [ScoreTask(pack_multi_item(q, items, 0), LABELS, lambda _: None)
             for q, items in make_requests(args.requests, 120, 10, 180, seed=0)]
    for _ in range(3):
        engine.finish(engine.launch(tasks))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            engine.finish(engine.launch(tasks))
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows,
                                    max_name_column_width=60))


if __name__ == "__main__":
    main()
