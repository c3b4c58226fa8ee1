"""Score a dataset offline with the service's configuration:

    python -m ranker_batch --config configs/score.yaml --kind score \\
        --input rows.parquet [more.parquet ...] --output scored/ [--id-column id]

Input: Parquet files or folders, or JSON lines (*.jsonl), local paths or URIs pyarrow reads;
one row per API request (ranker_batch/rows.py: `score` rows hold a /v1/score body's fields,
`rerank` rows a /v1/rerank body's). Output: Parquet files under --output with the id, the
scores, `prompt_tokens` and `error` (the API's 4xx message for a row it would refuse; such a
row never stops the job). The config is a Serve config (its first application's `args:`), so
FP8, the prefix cache, heads and templates apply as configured. Runs on the Ray cluster that
RAY_ADDRESS (or `ray job submit`) names, else on a local one. Shows Ray Data's progress bars and
ends with a summary: rows, items, error rows, items/s overall and per scorer, wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import ray
import yaml

from ranker_batch.job import run
from ranker_batch.rows import KINDS
from ranker_contract.config import AppConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ranker_batch",
                                description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True, help="a Serve config, e.g. "
                   "configs/score.yaml (its first application's args)")
    p.add_argument("--kind", choices=KINDS, required=True, help="the API the rows speak")
    p.add_argument("--input", nargs="+", required=True, help="Parquet or JSONL paths or URIs")
    p.add_argument("--output", required=True, help="a folder for the Parquet output; must be "
                   "empty or new, unless --resume")
    p.add_argument("--resume", action="store_true", help="--output (a local folder) holds what "
                   "a stopped run of this job wrote: score only the rows it lacks")
    p.add_argument("--id-column", default="id", help="passed through to the output")
    p.add_argument("--scorers", type=int, help="scoring actors (default: one per GPU; 1 on CPU)")
    p.add_argument("--preparers", type=int, help="most CPU actors that tokenize and pack "
                   "(default: 4 per GPU scorer, 1 on CPU)")
    p.add_argument("--scorer-resource", help="a custom resource the scoring actors need one "
                   "of (the nodes meant for scoring offer it)")
    p.add_argument("--summary-json", type=Path, help="also write the summary here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output = Path(args.output)
    if args.resume and "://" in args.output:
        sys.exit("--resume needs a local --output folder")
    if not args.resume and "://" not in args.output and output.exists() and any(output.iterdir()):
        sys.exit(f"--output {args.output} is not empty: pick a new folder, or --resume a stopped "
                 "run of the same job (a rerun would add a second copy of every row)")
    doc = yaml.safe_load(args.config.read_text())
    config = AppConfig.model_validate(doc["applications"][0].get("args") or {})
    ray.init(log_to_driver=False)
    summary = run(config, args.kind, args.input, args.output, id_column=args.id_column,
                  scorers=args.scorers, preparers=args.preparers,
                  scorer_resource=args.scorer_resource, resume=args.resume)
    facts = {"rows": summary.rows, "items": summary.items, "error_rows": summary.error_rows,
             "prompt_tokens": summary.prompt_tokens,
             "items_per_s": round(summary.items_per_s, 1),
             "items_per_s_per_scorer": round(summary.items_per_s / summary.scorers, 1),
             "scorers": summary.scorers, "wall_s": round(summary.wall_s, 2)}
    print("\n".join(f"{name:24s} {value}" for name, value in facts.items()))
    if args.summary_json:
        args.summary_json.write_text(json.dumps(facts | {"command": " ".join(sys.argv)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
