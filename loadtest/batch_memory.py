"""Does the batch job stream? Peak memory of a job on CPU whose scorer is a stand-in engine.

Usage: python -m loadtest.batch_memory --rows 2000000 [--object-store-mb 512]

Writes `--rows` token-id rows (a 32-token query, 4 items of 32 tokens) as Parquet, then runs
ranker_batch's pipeline (read → Prepare → Score → write Parquet) on a local Ray whose object
store is capped at `--object-store-mb`, with the real scheduling loop over an engine that
scores nothing (every label log-prob 0), so the pipeline runs at the speed of its CPU stages.
Samples the memory the job holds (used_bytes) every second; prints its peak, with the input's
size.
Memory that stays flat as --rows grows tenfold is what streaming means here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq
import ray

from gpu_worker.serving.scheduler import Scheduler
from loadtest.bench_batch import ids_table
from ranker_batch.job import read_input, score_dataset
from ranker_batch.stages import Score
from tools.configs import shipped_app_config
from tools.workload import Workload

WORKLOAD = Workload(query_len=32, items=4, item_len=32, vocab=49152)
CONFIG = "score.yaml"


class NullEngine:
    """Scores every item 0 for every label, at once."""

    asynchronous = False

    def launch(self, sequences, label_ids_per_sequence, **options):
        return [[[0.0] * len(ids)] * seq.num_items
                for seq, ids in zip(sequences, label_ids_per_sequence, strict=True)]

    def finish(self, step):
        return step


class NullScore(Score):
    """The job's Score stage with the scheduling loop driving NullEngine."""

    def __init__(self, config: dict, kind: str, id_column: str) -> None:
        import gpu_worker.serving.replica as replica

        def start_scorer(app, scheduler):
            loop = Scheduler(NullEngine(), scheduler, batch_token_budget=65536)
            loop.start()
            return replica.Scorer(None, None, loop)

        replica.start_scorer = start_scorer
        super().__init__(config, kind, id_column)


def used_bytes() -> int:
    """What this job holds: the private memory (USS) of this process and every process under
    it (Ray's GCS, raylet and workers), plus shared memory (/dev/shm, where Ray's object store
    lives). Page cache, reclaimable, is not counted."""
    total = shutil.disk_usage("/dev/shm").used
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.memory_full_info().uss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--object-store-mb", type=int, default=512)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="batch_memory_"))
    (work / "input").mkdir()
    rng, per_file = np.random.default_rng(0), 100_000
    for part, start in enumerate(range(0, args.rows, per_file)):
        pq.write_table(ids_table(rng, min(per_file, args.rows - start), WORKLOAD, start),
                       work / "input" / f"part-{part:04d}.parquet")
    input_bytes = sum(f.stat().st_size for f in (work / "input").iterdir())
    peak, done = [0], threading.Event()

    def sample():
        while not done.wait(1.0):
            peak[0] = max(peak[0], used_bytes())

    threading.Thread(target=sample, daemon=True).start()
    started = time.perf_counter()
    ray.init(object_store_memory=args.object_store_mb << 20, include_dashboard=False,
             log_to_driver=False)
    ds = score_dataset(read_input([str(work / "input")]), shipped_app_config(CONFIG), "score",
                       score_stage=NullScore)
    ds.write_parquet(str(work / "output"))
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in (work / "output").iterdir())
    wall_s = time.perf_counter() - started
    ray.shutdown()
    done.set()
    result = {"rows": args.rows, "rows_out": rows, "input_parquet_mb": input_bytes >> 20,
              "input_in_memory_mb": round(args.rows * (WORKLOAD.tokens_per_request + 2) * 8
                                          / 2**20),
              "object_store_mb": args.object_store_mb, "peak_used_mb": peak[0] >> 20,
              "wall_s": round(wall_s, 1), "command": "python -m loadtest.batch_memory "
              f"--rows {args.rows} --object-store-mb {args.object_store_mb}"}
    print(json.dumps(result))
    return 0 if rows == args.rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
