"""GPU throughput of the offline batch job (ranker_batch) on the standard bench shape.

Usage: python -m loadtest.bench_batch --rows 30000 --input ids|text --gpus 1
       [--config score-gpu.yaml] [--engine-bench PATH] [--out PATH] [--commit SHA]

Writes `--rows` rows of a 120-token query and 10 items of 180 tokens (token ids: uniform random
ids; text: natural words, tools/workload.py, about the same token counts) as Parquet, then runs
the job's Python interface (ranker_batch.job: read_input → score_dataset) on a local Ray with the
first `--gpus` GPUs, writing each output block as Parquet, while nvidia-smi samples each GPU's
utilization. `wall_s` is the whole job, the scorers' start-up (model load, budget probe, warm-up)
included. The steady rate excludes it: `items_per_s` is the items over the GPUs' busy span,
the longest stretch in which some GPU was busy with no idle gap over IDLE_GAP_S (the start-up's
own short bursts end well before it, or fall inside it and count against the rate).
`gpu_idle_share` is 1 − utilization over that span, averaged over the GPUs. Appends one object
to the JSON list `--out`; `engine_bench_items_per_s` is read from `--engine-bench` (a
loadtest/bench_engine.py JSON of the same call).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray

from ranker_batch.job import read_input, score_dataset
from tools import git_commit, gpu_name
from tools.configs import shipped_app_config
from tools.workload import WORDS, Workload

INPUT_FILES = 16
IDLE_GAP_S = 1.0


def ids_table(rng, rows: int, w: Workload, first_id: int) -> pa.Table:
    def lists(values: np.ndarray, size: int) -> pa.Array:
        return pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), size).cast(
            pa.list_(pa.int64()))

    queries = lists(rng.integers(0, w.vocab, (rows, w.query_len)), w.query_len)
    items = rng.integers(0, w.vocab, (rows * w.items, w.item_len))
    per_row = pa.ListArray.from_arrays(np.arange(0, rows * w.items + 1, w.items, dtype=np.int32),
                                       lists(items, w.item_len))
    return _table(first_id, rows, queries, per_row, w)


def text_table(rng, rows: int, w: Workload, first_id: int) -> pa.Table:
    words = np.array(WORDS)

    def text(tokens: int) -> str:
        return " ".join(words[rng.integers(0, len(words), round(rng.uniform(0.75, 1.25) * tokens))])

    queries = pa.array([text(w.query_len) for _ in range(rows)])
    per_row = pa.array([[text(w.item_len) for _ in range(w.items)] for _ in range(rows)])
    return _table(first_id, rows, queries, per_row, w)


def _table(first_id, rows, queries, items, w: Workload) -> pa.Table:
    return pa.table({"id": pa.array(range(first_id, first_id + rows), pa.int64()),
                     "query": queries, "items": items,
                     "label_token_ids": pa.array([list(w.labels)] * rows)})


def write_input(folder: Path, rows: int, text: bool) -> None:
    rng, w = np.random.default_rng(0), Workload()
    make = text_table if text else ids_table
    for part, start in enumerate(range(0, rows, -(-rows // INPUT_FILES))):
        n = min(-(-rows // INPUT_FILES), rows - start)
        pq.write_table(make(rng, n, w, start), folder / f"part-{part:03d}.parquet")


class UtilizationSampler:
    """nvidia-smi's utilization of each GPU every 100 ms: (time, gpu index, percent busy)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu",
             "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=path.open("w"), stderr=subprocess.DEVNULL)

    def stop(self) -> list[tuple[float, int, float]]:
        self.proc.terminate()
        self.proc.wait()
        samples = []
        for line in self.path.read_text().splitlines():
            stamp, index, util = (f.strip() for f in line.split(","))
            when = datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((when, int(index), float(util)))
        return samples


def run_job(folder: Path, config: str, gpus: int) -> list[tuple[int, int, int, int]]:
    """Per output block: (rows, items, prompt tokens, errors)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(gpus)))
    ray.init(include_dashboard=False, log_to_driver=False)
    ds = score_dataset(read_input([str(folder / "input")]), shipped_app_config(config), "score",
                       scorers=gpus)
    (folder / "output").mkdir()
    blocks = []
    for n, block in enumerate(ds.iter_batches(batch_size=None, batch_format="pyarrow")):
        blocks.append((block.num_rows,
                       pc.sum(pc.list_value_length(block.column("scores"))).as_py() or 0,
                       pc.sum(block.column("prompt_tokens")).as_py() or 0,
                       pc.count(block.column("error")).as_py()))
        pq.write_table(block, folder / "output" / f"part-{n:05d}.parquet")
    ray.shutdown()
    return blocks


def busy_span(samples: list[tuple[float, int, float]]) -> tuple[float, float]:
    """(start, end) of the longest stretch in which some GPU was busy, no gap over IDLE_GAP_S."""
    busy = sorted(when for when, _, util in samples if util > 0)
    best, start = (0.0, 0.0), busy[0]
    for before, after in zip(busy, busy[1:] + [float("inf")]):
        if after - before > IDLE_GAP_S:
            best = max(best, (start, before), key=lambda span: span[1] - span[0])
            start = after
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--input", choices=("ids", "text"), required=True)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--config", default="score-gpu.yaml", help="a file under configs/")
    p.add_argument("--engine-bench", type=Path, help="bench_engine JSON of the same call")
    p.add_argument("--out", type=Path, default=Path("docs/results/batch_h100/batch.json"))
    p.add_argument("--commit", help="the commit measured (default: git HEAD)")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_batch_"))
    (work / "input").mkdir()
    write_input(work / "input", args.rows, args.input == "text")
    sampler = UtilizationSampler(work / "utilization.csv")
    started = time.time()
    blocks = run_job(work, args.config, args.gpus)
    wall_s = time.time() - started
    samples = sampler.stop()
    rows, items, tokens, errors = (sum(b[i] for b in blocks) for i in range(4))
    if errors or rows != args.rows:
        sys.exit(f"the job lost or refused rows: {rows} rows of {args.rows}, {errors} errors")
    samples = [s for s in samples if s[1] < args.gpus]
    first, last = busy_span(samples)
    steady = items / (last - first)
    busy = [util for when, _, util in samples if first <= when <= last]
    engine_bench = (json.loads(args.engine_bench.read_text())["engine_items_per_s"]
                    if args.engine_bench else None)
    commit = args.commit or git_commit()
    gpu = gpu_name()
    run = {"gpu": gpu, "commit": commit,
           "command": "python -m loadtest.bench_batch " + " ".join(sys.argv[1:]),
           "gpus": args.gpus, "input": args.input, "rows": rows, "items": items,
           "items_per_s": round(steady, 1), "items_per_s_per_gpu": round(steady / args.gpus, 1),
           "engine_bench_items_per_s": engine_bench and round(engine_bench, 1),
           "per_gpu_share_of_engine_bench": engine_bench and round(steady / args.gpus
                                                                   / engine_bench, 3),
           "gpu_idle_share": round(1 - sum(busy) / len(busy) / 100, 3) if busy else None,
           "wall_s": round(wall_s, 1), "job_items_per_s": round(items / wall_s, 1),
           "busy_span_s": round(last - first, 1), "tokens_per_item": round(tokens / items, 1),
           "workload": Workload().describe()}
    runs = json.loads(args.out.read_text()) if args.out.exists() else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs + [run], indent=2))
    keys = ("gpus", "input", "items", "items_per_s_per_gpu", "engine_bench_items_per_s",
            "per_gpu_share_of_engine_bench", "gpu_idle_share", "busy_span_s", "wall_s",
            "job_items_per_s")
    print("\n".join(f"{k:30s} {run[k]}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
