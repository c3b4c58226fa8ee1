"""What the first batches of a new request shape cost on a freshly started scorer (GPU).

Usage: python -m loadtest.cold_start [--shapes long,short,lone] [--rate 60] [--seconds 6]
       [--out docs/results/cold_start.json]

Each shape runs in a fresh process that builds the engine the way a scorer replica does
(configs/score-gpu.yaml: Engine.from_config, Engine.measure_budget, then Engine.warm_up unless
--no-warm-up) and then:
1. sends Poisson traffic of that shape at --rate requests/s for --seconds through the real
   scheduling loop with the shipped admission settings, and counts what was refused (a
   sequence not started within max_queue_wait_s) in the first second and in all, and what was
   compiled or allocated meanwhile;
2. times one lone sequence of the shape twice (the idle path: a CUDA graph when one fits) and a
   full-budget batch of it twice (the eager path, as under load), each with what happened inside
   it: Triton kernels compiled, FlashInfer modules built, cudaMalloc and pinned host allocations,
   and the host functions that took longest the first time (cProfile).
Shapes (query tokens + items x item tokens): long 2000 + 20 x 50, short 20 + 50 x 20, lone
0 + 1 x 4000, bench 120 + 10 x 180. Prints one table; writes JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from gpu_worker.engine import Engine
from gpu_worker.scheduler import Scheduler, ScoreTask
from gpu_worker.warmup import triton_variants
from ranker_contract.errors import ScorerOverloaded
from ranker_contract.packing import pack_request
from serve_app.scoring import DELIMITER_ID
from tools import RESULTS_DIR
from tools.configs import shipped_app_config

CONFIG = "score-gpu.yaml"
SHAPES = {"long": (2000, 20, 50), "short": (20, 50, 20), "lone": (0, 1, 4000),
          "bench": (120, 10, 180)}
LABELS = [9454, 2753]


def sequences_of(shape: str, n: int, seed: int, max_seq_tokens: int):
    query_len, items, item_len = SHAPES[shape]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        query = [rng.randrange(1000, 150000) for _ in range(query_len)]
        item_ids = [[rng.randrange(1000, 150000) for _ in range(item_len)] for _ in range(items)]
        out.extend(pack_request(query, item_ids, item_first=False, delimiter_id=DELIMITER_ID,
                                max_seq_tokens=max_seq_tokens, max_context=1 << 30))
    return out


def counters() -> dict[str, int]:
    """Monotonic counts of the things that make a first batch slow."""
    device = torch.cuda.memory_stats()
    host = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
    return {"triton_kernels": triton_variants(), "flashinfer_builds": FLASHINFER_BUILDS[0],
            "cuda_malloc": device.get("num_device_alloc", -1),
            "host_alloc": host.get("num_host_alloc", -1)}


FLASHINFER_BUILDS = [0]


def count_flashinfer_builds() -> None:
    try:
        from flashinfer.jit import core
    except ImportError:
        return
    original = core.JitSpec.build_and_load

    def counted(self, *args, **kwargs):
        FLASHINFER_BUILDS[0] += 1
        return original(self, *args, **kwargs)

    core.JitSpec.build_and_load = counted


def timed_step(engine: Engine, seqs, overlapped: bool, profile: bool) -> dict:
    before = counters()
    prof = cProfile.Profile() if profile else None
    torch.cuda.synchronize()
    start = time.perf_counter()
    if prof:
        prof.enable()
    engine.finish(engine.launch(seqs, [LABELS] * len(seqs), overlapped=overlapped))
    if prof:
        prof.disable()
    seconds = time.perf_counter() - start
    after = counters()
    row = {"ms": round(seconds * 1e3, 2), "tokens": sum(s.num_tokens for s in seqs),
           "sequences": len(seqs), **{k: after[k] - before[k] for k in after}}
    if prof:
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(14)
        row["top"] = [line.strip() for line in text.getvalue().splitlines()
                      if line.strip()[:1].isdigit()][:14]
    return row


def traffic(engine: Engine, budget: int, shape: str, rate: float, seconds: float) -> dict:
    app = shipped_app_config(CONFIG)
    scheduler = Scheduler(engine, app.scheduler, batch_token_budget=budget)
    scheduler.start()
    rng, outcomes, lock = random.Random(1), [], threading.Lock()
    started = time.monotonic()
    pending = threading.Semaphore(0)
    sent = 0
    while (now := time.monotonic()) - started < seconds:
        for seq in sequences_of(shape, 1, 1000 + sent, app.limits.max_seq_tokens):
            def on_done(result, at=now - started):
                with lock:
                    outcomes.append((at, isinstance(result, ScorerOverloaded)))
                pending.release()
            scheduler.submit(ScoreTask(seq, LABELS, on_done))
            sent += 1
        time.sleep(rng.expovariate(rate))
    for _ in range(sent):
        pending.acquire()
    scheduler.stop()
    refused_first = sum(1 for at, refused in outcomes if refused and at < 1.0)
    return {"sent": sent, "refused": sum(r for _, r in outcomes),
            "refused_first_second": refused_first,
            "slowest_batches_s": sorted((r.seconds for r in scheduler.batch_log),
                                        reverse=True)[:3]}


def run_shape(shape: str, rate: float, seconds: float, skip_warm_up: bool) -> dict:
    count_flashinfer_builds()
    app = shipped_app_config(CONFIG)
    start = time.perf_counter()
    engine = Engine.from_config(app.resolved_model_path(), app.engine)
    budget = engine.measure_budget(app.scheduler.max_batch_tokens, app.limits.max_seq_tokens)
    if not skip_warm_up:
        engine.warm_up(budget.tokens, app.limits.max_seq_tokens)
    startup_s = time.perf_counter() - start
    one = sequences_of(shape, 1, 0, app.limits.max_seq_tokens)
    per_seq = max(s.num_tokens for s in one)
    full = sequences_of(shape, max(1, budget.tokens // per_seq), 1, app.limits.max_seq_tokens)
    before = counters()
    load = traffic(engine, budget.tokens, shape, rate, seconds)  # first: a new shape's first load
    load.update({k: v - before[k] for k, v in counters().items()})
    steps = {"lone_first": timed_step(engine, one, False, True),
             "lone_again": timed_step(engine, one, False, False),
             "full_first": timed_step(engine, full, True, True),
             "full_again": timed_step(engine, full, True, False)}
    return {"shape": shape, "startup_s": round(startup_s, 1), "budget_tokens": budget.tokens,
            "traffic": load, "steps": steps, "counters_after": counters()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="long,short,lone")
    p.add_argument("--rate", type=float, default=60.0)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--no-warm-up", action="store_true",
                   help="skip Engine.warm_up (the replica before it existed)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child process: this shape only
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "cold_start.json")
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_shape(args.one, args.rate, args.seconds, args.no_warm_up)))
        return
    results = []
    for shape in args.shapes.split(","):
        out = subprocess.run([sys.executable, "-m", "loadtest.cold_start", "--one", shape,
                              "--rate", str(args.rate), "--seconds", str(args.seconds)]
                             + ["--no-warm-up"] * args.no_warm_up,
                             capture_output=True, text=True)
        if out.returncode:
            print(out.stderr[-3000:])
            continue
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = results[-1]
        print(f"{shape}: start-up {r['startup_s']} s; " + "; ".join(
            f"{k} {v['ms']} ms (+{v['triton_kernels']} triton, +{v['flashinfer_builds']} fi, "
            f"+{v['cuda_malloc']} malloc, +{v['host_alloc']} pinned)"
            for k, v in r["steps"].items()) + f"; traffic {r['traffic']}")
        for k in ("lone_first", "full_first"):
            print(f"  {k} top:", *r["steps"][k].get("top", [])[:10], sep="\n    ")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "command":
                                    "python -m loadtest.cold_start " + " ".join(sys.argv[1:]),
                                    "results": results}, indent=1))


if __name__ == "__main__":
    main()
