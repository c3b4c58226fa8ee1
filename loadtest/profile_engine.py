"""Where one engine step's GPU time goes: torch profiler table of CUDA kernels.

Usage: python -m loadtest.profile_engine [--requests 33] [--model models/qwen3-0.6b-random]
The engine is built from configs/score-gpu.yaml (--model overrides its model folder). Runs the
bench workload of loadtest/bench_engine.py (120-token query + 10 × 180-token items per request,
tools/workload.py, seed 0) as one batch, warms up, profiles 3 steps and prints the top
kernels by total CUDA time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_worker.engine import Engine
from ranker_contract.packing import pack_multi_item
from tools.configs import shipped_app_config
from tools.workload import RequestFactory, Workload

CONFIG = "score-gpu.yaml"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help=f"default: model_path of configs/{CONFIG}")
    p.add_argument("--requests", type=int, default=33)
    p.add_argument("--rows", type=int, default=25)
    args = p.parse_args()
    app = shipped_app_config(CONFIG)
    engine = Engine.from_config(args.model or app.resolved_model_path(), app.engine)
    workload = Workload(query_len=120, items=10, item_len=180)
    factory = RequestFactory(workload, seed=0)
    sequences = [pack_multi_item(*factory.token_ids(), 0) for _ in range(args.requests)]
    label_ids = [list(workload.labels)] * len(sequences)
    for _ in range(3):
        engine.finish(engine.launch(sequences, label_ids))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            engine.finish(engine.launch(sequences, label_ids))
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows,
                                    max_name_column_width=60))


if __name__ == "__main__":
    main()
