"""Fit a calibration of relevance scores from labelled rerank rows:

    python -m ranker_batch.calibrate --config configs/score.yaml --input labelled.jsonl \\
        --output calibration/ [--method platt|isotonic] [--holdout 0.2] [--seed 0]

Input: `rerank` rows of the batch job (ranker_batch/rows.py: `query`, `documents`, optionally
`model` naming an adapter...) with an id column and `labels`: one per document, 0/1 or graded
in [0, 1]. The rows are scored by the batch job on the configured engine (into OUTPUT/scored,
as `python -m ranker_batch` writes it); then, per model or adapter the rows name, a map from the
raw relevance to a probability is fitted on the rows left after holding out a seeded share, and
the held-out rows report ECE, Brier score and log-loss before and after
(ranker_batch/calibration.py). Writes OUTPUT/calibration.json and prints one line per model;
the config's `calibration:` naming that file makes the service answer with it (docs/OPERATIONS.md,
"Calibration").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import ray
import yaml

from ranker_batch.calibration import METHODS, fit, metrics
from ranker_batch.job import read_input, run
from ranker_contract.config import AppConfig

LABELS = "labels"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ranker_batch.calibrate",
                                description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True, help="a Serve config, e.g. "
                   "configs/score.yaml (its first application's args)")
    p.add_argument("--input", nargs="+", required=True, help="Parquet or JSONL paths or URIs")
    p.add_argument("--output", type=Path, required=True, help="a new or empty folder")
    p.add_argument("--method", choices=METHODS, default="platt")
    p.add_argument("--holdout", type=float, default=0.2, help="share of rows held out to "
                   "report the metrics (0 < share < 1)")
    p.add_argument("--seed", type=int, default=0, help="of the held-out rows' draw")
    p.add_argument("--id-column", default="id")
    args = p.parse_args(argv)
    if not 0 < args.holdout < 1:
        p.error("--holdout must lie strictly between 0 and 1")
    return args


def labelled_rows(inputs: list[str], id_column: str) -> dict:
    """id → (labels, model) of every input row."""
    ds = read_input(inputs)
    names = ds.schema().names
    missing = [c for c in (id_column, LABELS) if c not in names]
    if missing:
        raise ValueError(f"the input has no {' and no '.join(missing)} column (its columns: "
                         f"{', '.join(names)})")
    columns = [id_column, LABELS] + (["model"] if "model" in names else [])
    return {row[id_column]: (row[LABELS], row.get("model"))
            for row in ds.select_columns(columns).iter_rows()}


def pairs_by_model(scored: Path, labelled: dict, id_column: str, default_model: str) -> dict:
    """model → list of rows, each row (raw relevance scores, labels) of one request."""
    table = pq.read_table(scored, columns=[id_column, "relevance_scores", "error"]).to_pylist()
    out: dict[str, list] = {}
    for row in table:
        labels, model = labelled[row[id_column]]
        if row["error"] is not None:
            raise ValueError(f"row {row[id_column]!r} was refused: {row['error']}")
        if len(labels) != len(row["relevance_scores"]):
            raise ValueError(f"row {row[id_column]!r}: {len(labels)} labels for "
                             f"{len(row['relevance_scores'])} documents")
        out.setdefault(model or default_model, []).append((row["relevance_scores"], labels))
    return out


def calibrate(rows: list, method: str, holdout: float, seed: int) -> dict:
    """The map fitted on the rows not held out, and the held-out rows' metrics."""
    order = np.random.default_rng(seed).permutation(len(rows))
    held_n = max(1, round(holdout * len(rows)))
    if len(rows) - held_n < 1:
        raise ValueError(f"{len(rows)} rows: too few to hold {holdout:g} out and fit on the rest")

    def flat(indices):
        raw = np.array([s for k in indices for s in rows[k][0]], dtype=np.float64)
        return raw, np.array([y for k in indices for y in rows[k][1]], dtype=np.float64)

    fit_raw, fit_labels = flat(order[held_n:])
    held_raw, held_labels = flat(order[:held_n])
    cal = fit(fit_raw, fit_labels, method)
    flat_map = method == "platt" and cal.params[0] == 0.0
    return {"calibration": cal.to_json(),
            "warning": "its raw scores do not rank the fitted rows' labels (the best slope is "
                       "≤ 0): the map answers their base rate" if flat_map else None,
            "rows": {"fitted": len(rows) - held_n, "held_out": held_n},
            "documents": {"fitted": int(fit_raw.size), "held_out": int(held_raw.size)},
            "held_out": {"raw": metrics(held_raw, held_labels),
                         "calibrated": metrics(cal.apply(held_raw), held_labels)}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.output.exists() and any(args.output.iterdir()):
        sys.exit(f"--output {args.output} is not empty: pick a new folder")
    doc = yaml.safe_load(args.config.read_text())
    config = AppConfig.model_validate(doc["applications"][0].get("args") or {})
    # fitted on the model's own relevance: a map the config already has is not applied
    config = config.model_copy(update={"calibration": None})
    ray.init(log_to_driver=False)
    try:  # a bad input ends with its reason, not a traceback
        labelled = labelled_rows(args.input, args.id_column)
        scored = args.output / "scored"
        run(config, "rerank", args.input, str(scored), id_column=args.id_column)
        models = pairs_by_model(scored, labelled, args.id_column, config.served_model_name)
        fitted = {name: calibrate(rows, args.method, args.holdout, args.seed)
                  for name, rows in sorted(models.items())}
    except ValueError as exc:
        sys.exit(f"calibrate: {exc}")
    result = {"method": args.method, "holdout": args.holdout, "seed": args.seed,
              "config": str(args.config), "command": " ".join(sys.argv), "models": fitted}
    (args.output / "calibration.json").write_text(json.dumps(result, indent=1))
    print(f"{'model':28s} {'rows':>6s} {'ECE raw → calibrated':>22s} {'log-loss':>18s}")
    for name, fitted in result["models"].items():
        raw, cal = fitted["held_out"]["raw"], fitted["held_out"]["calibrated"]
        print(f"{name:28s} {fitted['rows']['fitted'] + fitted['rows']['held_out']:6d} "
              f"{raw['ece']:10.4f} → {cal['ece']:.4f} {raw['log_loss']:8.4f} → "
              f"{cal['log_loss']:.4f}")
    for name, fitted in result["models"].items():
        if fitted["warning"]:
            print(f"warning: {name}: {fitted['warning']}")
    print(f"wrote {args.output / 'calibration.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
