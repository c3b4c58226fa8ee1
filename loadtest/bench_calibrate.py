"""The time of fitting a calibration (python -m ranker_batch.calibrate) against the batch job's
own time on the same labelled rows (docs/BENCHMARKS.md, "Calibration").

Usage: python -m loadtest.bench_calibrate [--rows 10000] [--config configs/score-gpu.yaml]
       [--out PATH] [--commit SHA]

Writes `--rows` rerank rows of the bench shape as text (a 120-token query and 10 documents of
180 tokens of natural words, tools/workload.py) with a seeded 0/1 label per document (drawn at
random: this measures time, not fit quality), then runs, each as its own process with its own
local Ray, `python -m ranker_batch --kind rerank` and `python -m ranker_batch.calibrate` on
them, and appends both wall times (each includes its Ray start and the scorers' start-up) and
their ratio to the JSON list `--out`. First it times what a configured map adds to a rerank
answer on this machine's CPU (the only work calibration adds to a request): CalibrationMap.apply
over a response's scores, for 1, 10, 100 and 1,000 documents (`apply_us`, the median of 200
rounds, Platt and isotonic).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ranker_contract.calibration import CalibrationMap
from tools import REPO_ROOT, git_commit, gpu_name
from tools.workload import PRESETS, RequestFactory, Workload


def labelled_rows(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    w = Workload(**PRESETS["standard"], text="natural")
    requests = RequestFactory(w, seed=seed)
    queries, documents = [], []
    for _ in range(rows):
        query, items = requests.texts()
        queries.append(query)
        documents.append(items)
    labels = (rng.random((rows, w.items)) < 0.3).astype(float).tolist()
    return pa.table({"id": list(range(rows)), "query": queries, "documents": documents,
                     "labels": labels})


def apply_us() -> dict:
    maps = {"platt": CalibrationMap("platt", (0.8, -0.5)),
            "isotonic": CalibrationMap("isotonic", z=tuple(np.linspace(-6, 6, 64)),
                                       y=tuple(np.linspace(0.01, 0.99, 64)))}
    out: dict = {}
    for name, cal in maps.items():
        for n in (1, 10, 100, 1000):
            scores = np.random.default_rng(n).random(n).tolist()
            rounds = []
            for _ in range(200):
                started = time.perf_counter()
                cal.apply(np.array(scores)).tolist()
                rounds.append(time.perf_counter() - started)
            out[f"{name}_{n}"] = round(float(np.median(rounds)) * 1e6, 1)
    return out


def timed(args: list[str]) -> float:
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", *args], cwd=REPO_ROOT, capture_output=True,
                         text=True)
    if run.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return time.monotonic() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--config", default="configs/score-gpu.yaml")
    p.add_argument("--out", type=Path, default=Path("bench_calibrate.json"))
    p.add_argument("--commit", default=None)
    args = p.parse_args()
    apply = apply_us()
    with tempfile.TemporaryDirectory(prefix="bench-calibrate-") as tmp:
        source = Path(tmp) / "labelled.parquet"
        pq.write_table(labelled_rows(args.rows), source)
        batch_s = timed(["ranker_batch", "--config", args.config, "--kind", "rerank",
                         "--input", str(source), "--output", str(Path(tmp) / "scored")])
        calibrate_s = timed(["ranker_batch.calibrate", "--config", args.config,
                             "--input", str(source), "--output", str(Path(tmp) / "fit")])
        fitted = json.loads((Path(tmp) / "fit" / "calibration.json").read_text())
    result = {"command": " ".join(["python -m loadtest.bench_calibrate", *sys.argv[1:]]),
              "gpu": gpu_name(), "commit": args.commit or git_commit(),
              "date": datetime.now(UTC).isoformat(timespec="seconds"),
              "workload": {"rows": args.rows, "documents_per_row": 10, "query_tokens": 120,
                           "document_tokens": 180, "input": "text", "config": args.config},
              "labelled_documents": args.rows * 10,
              "batch_job_s": round(batch_s, 1), "calibrate_s": round(calibrate_s, 1),
              "calibrate_to_batch_job": round(calibrate_s / batch_s, 3),
              "rows_fitted": {name: m["rows"] for name, m in fitted["models"].items()},
              "apply_us": apply}
    runs = json.loads(args.out.read_text()) if args.out.exists() else []
    args.out.write_text(json.dumps([*runs, result], indent=1) + "\n")
    print(f"{'rows':>8s} {'documents':>10s} {'batch job s':>12s} {'calibrate s':>12s} "
          f"{'ratio':>6s}")
    print(f"{args.rows:8d} {args.rows * 10:10d} {batch_s:12.1f} {calibrate_s:12.1f} "
          f"{calibrate_s / batch_s:6.2f}")
    print("a map applied to a response's scores, µs:", apply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
