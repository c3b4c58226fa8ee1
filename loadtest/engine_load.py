"""Latency in the engine under an open-loop load: requests arrive at a constant rate, a share of
the engine's own capacity, and each is timed from its submission to its scores.

Usage: python -m loadtest.engine_load [--shares 0.25,0.5,0.75,0.9] [--seconds 8]
       [--arrival constant|poisson] [--precision bf16|fp8] [--policies shipped,eager_behind]
       [--token-buckets N,...] [--out FILE] [--commit SHA]

The engine, its batch budget and the scheduling loop are built from configs/score-gpu.yaml the
way a scorer replica builds them (as loadtest/bench_engine.py does), and requests go through
`Scheduler.run_job` on an asyncio loop, as the replica's event loop sends them; there is no HTTP,
Ray or tokenizer here, so what it shows is the loop's and the device's share of a request's
latency (the headline, loadtest/headline.py, measures the service around it). Workload: the
bench shape (a 120-token query and 10 items of 180 tokens, fresh random ids per request).
Capacity: items/s of a burst of every request queued at once. Then, per share, requests at
share × capacity for --seconds (the first second not counted), sent at a constant interval or
as Poisson arrivals (`--arrival`; the headline's load generator sends Poisson): latency p50/p99,
the batches' tokens, their host launch time and launch-to-results time, and the share of
batches that replayed a CUDA graph.

Policies (how the engine is driven; the loop and engine are the shipped ones):
- shipped: as a replica runs it (a batch that fits a CUDA graph replays it).
- eager_behind: a batch launched while another is on the device never replays a graph (the
  rule before graphs were replayed under load).
- sync: the shipped loop with `overlap: false` (each batch finished right after its launch).
`--token-buckets` replaces the config's CUDA-graph token buckets (an experiment's knob).
Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import torch

from gpu_worker.forward.engine import Engine, Step
from gpu_worker.forward.startup import measure_budget
from gpu_worker.serving.scheduler import Scheduler
from loadtest.bench_engine import run_scheduler
from ranker_contract.packing import PackedSequence, ScoreJob, pack_multi_item
from tools import RESULTS_DIR, git_commit
from tools.configs import shipped_app_config
from tools.stats import percentile, summarize_ms
from tools.workload import ARRIVALS, RequestFactory, Workload, arrival_offsets

CONFIG = "score-gpu.yaml"
WARM_S = 1.0  # the first second of each point is not counted


class DrivenEngine:
    """The engine as the scheduling loop sees it, counting batches and the graph replays the
    engine actually launched (its CudaGraphs.launch, wrapped until close()); with
    `eager_behind`, a batch launched while another is on the device never replays a graph."""

    def __init__(self, engine: Engine, eager_behind: bool) -> None:
        self.engine, self.eager_behind = engine, eager_behind
        self.asynchronous = engine.asynchronous
        self.batches = self.graph_batches = self.tokens = self.on_device = 0
        self.launch_s: list[float] = []  # host time of each engine.launch
        graphs = engine.graphs
        if graphs is not None:
            replay = graphs.launch

            def counted(*args, **kwargs):
                self.graph_batches += 1
                return replay(*args, **kwargs)

            graphs.launch = counted  # shadows the method on this instance only

    def close(self) -> None:
        if self.engine.graphs is not None:
            del self.engine.graphs.launch  # the class's method again

    def launch(self, sequences: list[PackedSequence], label_ids_per_sequence: list[list[int]],
               **options) -> Step:
        self.batches += 1
        self.tokens += sum(s.num_tokens for s in sequences)
        eager = self.eager_behind and self.on_device > 0
        self.on_device += 1
        started = time.perf_counter()
        step = self.engine.launch(sequences, label_ids_per_sequence, eager=eager, **options)
        self.launch_s.append(time.perf_counter() - started)
        return step

    def finish(self, step: Step) -> list[list[list[float]]]:
        self.on_device -= 1
        return self.engine.finish(step)


async def open_loop(scheduler: Scheduler, sequences: list[PackedSequence], labels: list[int],
                    offsets: list[float]) -> list[float]:
    """Submit one request at each offset (s); latency (s) of those sent after WARM_S."""
    latencies: list[float] = []

    async def one(seq: PackedSequence, counted: bool) -> None:
        sent = time.perf_counter()
        await scheduler.run_job(ScoreJob([seq], labels))
        if counted:
            latencies.append(time.perf_counter() - sent)

    start, tasks = time.perf_counter(), []
    for k, offset in enumerate(offsets):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(sequences[k % len(sequences)], offset >= WARM_S)))
    await asyncio.gather(*tasks)
    return latencies


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shares", default="0.25,0.5,0.75,0.9")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--arrival", choices=ARRIVALS, default="constant")
    p.add_argument("--precision", choices=("bf16", "fp8"), default="bf16")
    p.add_argument("--token-buckets", help="CUDA-graph token buckets, replacing the config's")
    p.add_argument("--policies", default="shipped,eager_behind")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "engine_load.json")
    p.add_argument("--commit", help="the commit measured (default: $COMMIT, else git HEAD)")
    args = p.parse_args()

    app = shipped_app_config(CONFIG)
    engine_cfg = app.engine.model_copy(update={"precision": args.precision})
    if args.token_buckets:
        graphs = engine_cfg.cuda_graphs.model_copy(update={
            "token_buckets": tuple(int(b) for b in args.token_buckets.split(","))})
        engine_cfg = engine_cfg.model_copy(update={"cuda_graphs": graphs})
    engine = Engine.from_config(app.resolved_model_path(), engine_cfg)
    budget = measure_budget(engine, app.scheduler.max_batch_tokens,
                            app.limits.max_seq_tokens).tokens
    workload = Workload()
    labels = list(workload.labels)
    factory = RequestFactory(workload, seed=0)
    sequences = [pack_multi_item(q, items, 0)
                 for q, items in (factory.token_ids() for _ in range(1024))]
    burst = app.scheduler.model_copy(update={"max_queue_wait_s": 0})
    run_scheduler(engine, sequences[:64], burst, budget, labels)  # compile and warm
    seconds, _ = run_scheduler(engine, sequences, burst, budget, labels)
    capacity_rps = len(sequences) / seconds

    rows = []
    for policy in args.policies.split(","):
        for share in map(float, args.shares.split(",")):
            driven = DrivenEngine(engine, eager_behind=policy == "eager_behind")
            loop_cfg = app.scheduler.model_copy(update={"overlap": policy != "sync"})
            scheduler = Scheduler(driven, loop_cfg, budget)
            scheduler.start()
            offsets = arrival_offsets(args.arrival, share * capacity_rps, args.seconds)
            latencies = asyncio.run(open_loop(scheduler, sequences, labels, offsets))
            scheduler.stop()
            driven.close()
            batches = list(scheduler.batch_log)
            rows.append({"policy": policy, "share": share, "rps": share * capacity_rps,
                         "latency_ms": summarize_ms(latencies), "batches": driven.batches,
                         "mean_batch_tokens": driven.tokens / max(driven.batches, 1),
                         "graph_share": driven.graph_batches / max(driven.batches, 1),
                         "batch_tokens_p99": percentile([b.tokens for b in batches], 99),
                         "launch_ms": summarize_ms(driven.launch_s),
                         "batch_ms": summarize_ms(b.seconds for b in batches)})
    out = {
        "capacity_items_per_s": capacity_rps * workload.items,
        "rows": rows,
        "gpu": torch.cuda.get_device_name(),
        "commit": args.commit or os.environ.get("COMMIT") or git_commit(),
        "command": " ".join(["python -m", __spec__.name, *sys.argv[1:]]),
        "workload": {"query_len": workload.query_len, "items": workload.items,
                     "item_len": workload.item_len, "seed": 0, "precision": args.precision,
                     "batch_token_budget": budget, "seconds": args.seconds,
                     "arrival": args.arrival,
                     "token_buckets": list(engine_cfg.cuda_graphs.token_buckets)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"capacity {out['capacity_items_per_s']:.0f} items/s ({args.precision}, "
          f"{out['gpu']})")
    print(f"{'policy':14s} {'share':>6s} {'p50 ms':>8s} {'p99 ms':>8s} {'batches':>8s} "
          f"{'tokens':>8s} {'tok p99':>8s} {'graphs':>7s} {'launch p50/p99':>15s} "
          f"{'batch p50/p99':>14s}")
    for r in rows:
        print(f"{r['policy']:14s} {r['share']:6.2f} {r['latency_ms']['p50']:8.1f} "
              f"{r['latency_ms']['p99']:8.1f} {r['batches']:8d} {r['mean_batch_tokens']:8.0f} "
              f"{r['batch_tokens_p99'] or 0:8d} {r['graph_share']:7.1%} "
              f"{r['launch_ms']['p50']:7.1f}/{r['launch_ms']['p99']:<7.1f} "
              f"{r['batch_ms']['p50']:6.1f}/{r['batch_ms']['p99']:<7.1f}")


if __name__ == "__main__":
    main()
