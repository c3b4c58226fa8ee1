"""python -m ranker_batch.calibrate on the CPU default: labelled rerank rows are scored by the
batch job, a map is fitted per model, a bad input ends with its reason; with the map in its
config, the batch job writes the calibrated relevance and the raw one."""

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ranker_batch.calibration import CalibrationMap, metrics
from tools import REPO_ROOT

pytestmark = pytest.mark.service  # starts Ray

CONFIG = str(REPO_ROOT / "configs" / "score.yaml")
FACTS = [("What is the capital of France?", "Paris is the capital of France."),
         ("How many legs does a spider have?", "A spider has eight legs."),
         ("What do bees make?", "Bees make honey from nectar."),
         ("Which planet is the largest?", "Jupiter is the largest planet."),
         ("What is water made of?", "Water is hydrogen and oxygen.")]


def _rows(n: int) -> list[dict]:
    """Each query with its answer (label 1) and two other facts' answers (label 0)."""
    rows = []
    for k in range(n):
        query, answer = FACTS[k % len(FACTS)]
        others = [FACTS[(k + j) % len(FACTS)][1] for j in (1, 2)]
        rows.append({"id": k, "query": query, "documents": [others[0], answer, others[1]],
                     "labels": [0.0, 1.0, 0.0]})
    return rows


def _module(tmp_path, module, *args):
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _calibrate(tmp_path, rows, *extra):
    source = tmp_path / "labelled.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source)
    output = tmp_path / "calibration"
    run = _module(tmp_path, "ranker_batch.calibrate", "--config", CONFIG, "--input", str(source),
                  "--output", str(output), *extra)
    return run, output


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("calibrate")
    run, output = _calibrate(tmp_path, _rows(20), "--holdout", "0.25")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run, output


def test_a_map_is_fitted_on_the_rows_the_batch_job_scored(fitted):
    run, output = fitted
    result = json.loads((output / "calibration.json").read_text())
    (name, fitted), = result["models"].items()  # no `model` column: the served model's
    assert fitted["rows"] == {"fitted": 15, "held_out": 5}
    assert fitted["documents"] == {"fitted": 45, "held_out": 15}
    # The batch job's output is there, every row scored, and the map fitted on it lowers the
    # log-loss of these rows (each fact comes back four times: the held-out rows repeat fitted
    # ones; the held-out draw is seeded and CPU scores are deterministic).
    scored = pq.read_table(output / "scored").to_pylist()
    assert len(scored) == 20 and all(row["error"] is None for row in scored)
    labels = {row["id"]: row["labels"] for row in _rows(20)}
    raw = np.array([s for row in scored for s in row["relevance_scores"]])
    y = np.array([v for row in scored for v in labels[row["id"]]])
    cal = CalibrationMap.from_json(fitted["calibration"])
    assert metrics(cal.apply(raw), y)["log_loss"] < metrics(raw, y)["log_loss"]
    assert f"wrote {output / 'calibration.json'}" in run.stdout


def test_rows_without_labels_are_refused_before_scoring(tmp_path):
    rows = [{k: v for k, v in row.items() if k != "labels"} for row in _rows(4)]
    run, output = _calibrate(tmp_path, rows)
    assert run.returncode != 0
    assert "no labels column" in run.stderr and "Traceback" not in run.stderr
    assert not (output / "scored").exists()


def test_with_the_map_in_its_config_the_batch_job_writes_both_scores(fitted, tmp_path):
    _, output = fitted
    config = yaml.safe_load(open(CONFIG))
    config["applications"][0]["args"]["calibration"] = str(output / "calibration.json")
    (tmp_path / "calibrated.yaml").write_text(yaml.safe_dump(config))
    rows = [{k: v for k, v in row.items() if k != "labels"} for row in _rows(20)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    run = _module(tmp_path, "ranker_batch", "--config", str(tmp_path / "calibrated.yaml"),
                  "--kind", "rerank", "--input", str(tmp_path / "rows.parquet"),
                  "--output", str(tmp_path / "scored"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = {r["id"]: r for r in pq.read_table(tmp_path / "scored").to_pylist()}
    before = {r["id"]: r for r in pq.read_table(output / "scored").to_pylist()}
    (entry,) = json.loads((output / "calibration.json").read_text())["models"].values()
    cal = CalibrationMap.from_json(entry["calibration"])
    for key, row in got.items():
        # the raw relevance is what the uncalibrated job wrote, and the calibrated one its map
        assert row["raw_relevance_scores"] == pytest.approx(before[key]["relevance_scores"])
        assert row["relevance_scores"] == pytest.approx(
            cal.apply(np.array(row["raw_relevance_scores"])).tolist())
