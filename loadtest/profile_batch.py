"""Where a full batch's device time goes, per request shape: the shipped engine's kernels grouped
by what they compute (attention, the linears, norms and RoPE, the label log-probs, copies, the
rest), with deterministic scores on (shipped) and off, for the bench shape and the feed shape
(the workloads issue: profile the feed shape before choosing a fix).

Usage: python -m loadtest.profile_batch [--shapes 120x10x180,300x100x10] [--steps 5]
       [--config score-gpu.yaml] [--budget TOKENS] [--out docs/results/profile_batch.json]

Per shape (query tokens x items x tokens per item): as many requests as fit the batch budget
(scheduler.max_batch_tokens, or --budget), each packed as the ingress packs it (pack_request),
run as one batch through Engine.launch + finish, as the scheduling loop runs a full batch;
after 3 warm-up steps, the median wall and launch (host) ms of `--steps` steps, then `--steps`
steps under the torch profiler: each kernel's own device time summed per category
(CATEGORIES, by kernel name), per batch. On a CPU engine (--config score.yaml) the aten ops'
own CPU time stands in, summed over threads: a check that the tool runs, not a profile. Prints
a table per shape; writes JSON with the command, device, commit, shapes and the top kernels of
each run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_worker.forward.engine import Engine
from loadtest.engine_latency import wall_and_launch_ms
from ranker_contract.packing import PackedSequence, pack_request
from tools import RESULTS_DIR, git_commit
from tools.configs import shipped_app_config
from tools.workload import RequestFactory, Workload

# category -> substrings of a kernel's (or CPU op's) lower-cased name; the first match wins
CATEGORIES = {
    "attention": ("flashinfer", "prefill", "attention", "fmha", "flash", "merge_state",
                  "scaled_dot_product"),
    "norm and rope": ("norm", "rope"),
    "label log-probs": ("log_sum_exp", "logsumexp", "gather", "index"),
    "linears": ("gemm", "cutlass", "nvjet", "xmma", "cublas", "gate_up", "lora", "matmul",
                "sm90", "wgmma", "aten::mm", "aten::addmm", "aten::linear", "quantize"),
    "copies": ("memcpy", "memset", "copy", "fill", "aten::cat"),
}
TOP_KERNELS = 12


def category(name: str) -> str:
    lowered = name.lower()
    return next((cat for cat, keys in CATEGORIES.items() if any(k in lowered for k in keys)),
                "other")


def full_batch(shape: tuple[int, int, int], budget: int, max_seq_tokens: int,
               max_context: int, vocab: int) -> tuple[list[PackedSequence], list[list[int]], int]:
    """The sequences of as many requests of `shape` (ids in [0, vocab)) as fit `budget` tokens
    (at least one), their label ids, and the requests' count."""
    query_len, items, item_len = shape
    factory = RequestFactory(Workload(query_len=query_len, items=items, item_len=item_len,
                                      vocab=vocab), seed=0)
    sequences: list[PackedSequence] = []
    requests = 0
    while True:
        query, item_ids = factory.token_ids()
        packed = pack_request(query, item_ids, item_first=False, delimiter_id=0,
                              max_seq_tokens=max_seq_tokens, max_context=max_context)
        tokens = sum(s.num_tokens for s in sequences) + sum(s.num_tokens for s in packed)
        if requests and tokens > budget:
            break
        sequences += packed
        requests += 1
    return sequences, [list(factory.workload.labels)] * len(sequences), requests


def run(engine: Engine, batch: tuple[list[PackedSequence], list[list[int]]],
        steps: int) -> dict:
    """Wall and launch ms (medians) and, per category, device ms per batch."""
    wall_ms, launch_ms = wall_and_launch_ms(engine, batch, steps)
    cuda = engine.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.finish(engine.launch(*batch))
    kernels = []
    for event in prof.key_averages():
        own_us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if own_us > 0 and (cuda or event.key.startswith("aten::")):
            kernels.append((event.key, own_us / steps / 1e3))
    by_category: dict[str, float] = {}
    for name, ms in kernels:
        by_category[category(name)] = by_category.get(category(name), 0.0) + ms
    total = sum(by_category.values())
    kernels.sort(key=lambda k: -k[1])
    return {"wall_ms": round(wall_ms, 3), "launch_ms": round(launch_ms, 3),
            "device_ms": round(total, 3),
            "by_category_ms": {c: round(ms, 3) for c, ms in
                               sorted(by_category.items(), key=lambda kv: -kv[1])},
            "top_kernels_ms": [[name[:160], round(ms, 3)] for name, ms in kernels[:TOP_KERNELS]]}


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for part in text.split(","):
        query_len, items, item_len = (int(x) for x in part.split("x"))
        shapes.append((query_len, items, item_len))
    return shapes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="120x10x180,300x100x10",
                   help="QUERYxITEMSxITEM_LEN, comma-separated (default: bench and feed)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--config", default="score-gpu.yaml", help="a file of configs/")
    p.add_argument("--budget", type=int, help="tokens a batch (default: the config's "
                   "scheduler.max_batch_tokens)")
    p.add_argument("--commit", help="the commit measured (default: $COMMIT, else git HEAD)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "profile_batch.json")
    args = p.parse_args()
    app = shipped_app_config(args.config)
    budget = args.budget or app.scheduler.max_batch_tokens
    shipped = Engine.from_config(app.resolved_model_path(), app.engine)
    off_cfg = app.engine.model_copy(update={"deterministic": False})
    engines = {"deterministic": shipped, "off": Engine(shipped.model, shipped.device, off_cfg)}
    max_context = shipped.model.config.max_position_embeddings
    rows = []
    for shape in parse_shapes(args.shapes):
        sequences, labels, requests = full_batch(shape, budget, app.limits.max_seq_tokens,
                                                 max_context, shipped.model.config.vocab_size)
        for name, engine in engines.items():
            result = run(engine, (sequences, labels), args.steps)
            rows.append({"shape": list(shape), "deterministic": name == "deterministic",
                         "requests": requests, "items": requests * shape[1],
                         "sequences": len(sequences),
                         "tokens": sum(s.num_tokens for s in sequences), **result})
    device = (torch.cuda.get_device_name() if shipped.device.type == "cuda"
              else f"cpu ({torch.get_num_threads()} threads)")
    out = {"command": "python -m loadtest.profile_batch " + " ".join(sys.argv[1:]),
           "device": device, "commit": args.commit or git_commit(), "config": args.config,
           "budget_tokens": budget, "steps": args.steps, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for row in rows:
        query_len, items, item_len = row["shape"]
        print(f"\n{query_len} + {items} x {item_len}, deterministic "
              f"{'on' if row['deterministic'] else 'off'}: {row['requests']} requests, "
              f"{row['tokens']} tokens; wall {row['wall_ms']} ms, launch {row['launch_ms']} ms, "
              f"device {row['device_ms']} ms ({row['items'] / row['wall_ms'] * 1e3:,.0f} items/s)")
        for cat, ms in row["by_category_ms"].items():
            share = ms / row["device_ms"] if row["device_ms"] else 0.0
            print(f"  {cat:<16s} {ms:9.3f} ms {share:6.1%}")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
