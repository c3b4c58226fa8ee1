"""The offline batch job (python -m ranker_batch) on a local Ray, against the live service
(the shared `client`, the same configs/score.yaml model): every row equals what the same body
sent to the service answers, a row the API refuses carries its 4xx message, a scoring actor
killed mid-job costs no row and repeats none, and a job whose driver died resumes."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.cpu.processes import kill_all
from tools import REPO_ROOT

pytestmark = pytest.mark.service  # starts Ray

YES, NO = 10539, 5230  # "Yes", "No" of the default model's vocabulary
CONFIG = str(REPO_ROOT / "configs" / "score.yaml")


def run_job(kind, rows, tmp_path, *extra, wait=True):
    source, output = tmp_path / f"{kind}.parquet", tmp_path / f"{kind}-out"
    pq.write_table(pa.Table.from_pylist(rows), source)
    command = [sys.executable, "-m", "ranker_batch", "--config", CONFIG, "--kind", kind,
               "--input", str(source), "--output", str(output),
               "--summary-json", str(tmp_path / f"{kind}.json"), *extra]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
    log = tmp_path / f"{kind}.log"
    with open(log, "w") as sink:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=sink,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    if not wait:
        return process, output
    process.wait(timeout=600)
    assert process.returncode == 0, log.read_text()[-3000:]
    return {r["id"]: r for r in pq.read_table(output).to_pylist()}, \
        json.loads((tmp_path / f"{kind}.json").read_text())




SCORE_ROWS = [
    {"id": 1, "query": "Is the sky blue?", "items": ["Yes it is.", "No.", "Maybe"],
     "label_token_ids": [YES, NO], "apply_softmax": True, "item_first": None},
    {"id": 2, "query": "What is 2+2?", "items": ["4", "five", ""],
     "label_token_ids": [YES, NO], "apply_softmax": None, "item_first": True},
    {"id": 3, "query": "too big", "items": ["x"], "label_token_ids": [10 ** 9],
     "apply_softmax": None, "item_first": None},
]
ID_ROWS = [{"id": 10 + i, "query": [1, 2, 3, 4 + i], "items": [[5, 6], [7], [8, 9, 10 + i]],
            "label_token_ids": [YES, NO]} for i in range(3)]
RERANK_ROWS = [
    {"id": "a", "query": "capital of France?", "documents": ["Paris is.", "Berlin.", "No"],
     "instruction": None},
    {"id": "b", "query": "fast cars", "documents": ["A Ferrari.", "A snail."],
     "instruction": "Judge speed."},
    {"id": "c", "query": None, "documents": ["x"], "instruction": None},
]


def api_answer(client, path, row, fields):
    body = {k: row[k] for k in fields if row.get(k) is not None}
    return client.post(path, json=body)


@pytest.mark.parametrize("rows", [SCORE_ROWS, ID_ROWS], ids=["text", "token ids"])
def test_score_rows_equal_the_service(client, tmp_path, rows):
    out, summary = run_job("score", rows, tmp_path)
    assert sorted(out) == [r["id"] for r in rows]
    for row in rows:
        r = api_answer(client, "/v1/score", row, ("query", "items", "label_token_ids",
                                                  "apply_softmax", "item_first"))
        got = out[row["id"]]
        if r.status_code == 200:
            assert got["error"] is None
            # bit for bit: an item's score does not depend on its batch (docs/OPERATIONS.md,
            # "Deterministic scores")
            assert got["scores"] == r.json()["scores"], row["id"]
            assert got["prompt_tokens"] == r.json()["usage"]["prompt_tokens"]
        else:
            assert got["scores"] is None
            assert got["error"] == f"{r.status_code} {r.json()['error']['message']}"
    errors = sum(out[r["id"]]["error"] is not None for r in rows)
    assert summary["rows"] == len(rows) and summary["error_rows"] == errors
    assert summary["items"] == sum(len(out[r["id"]]["scores"] or []) for r in rows)


def test_rerank_rows_equal_the_service(client, tmp_path):
    out, summary = run_job("rerank", RERANK_ROWS, tmp_path)
    for row in RERANK_ROWS:
        r = api_answer(client, "/v1/rerank", row, ("query", "documents", "instruction"))
        got = out[row["id"]]
        if r.status_code != 200:
            assert got["error"] == f"{r.status_code} {r.json()['error']['message']}"
            continue
        by_index = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        assert got["relevance_scores"] == [by_index[i] for i in range(len(by_index))]
    assert out["c"]["error"] == "400 query is required"  # a null field is a missing one
    assert summary["error_rows"] == 1


def _score_actor_pids() -> set[int]:
    found = set()
    for p in psutil.process_iter(["cmdline"]):
        if any("MapBatches(Score)" in part for part in p.info["cmdline"] or ()):
            found.add(p.pid)
    return found


def test_a_scoring_actor_killed_mid_job_loses_and_repeats_no_row(tmp_path):
    rows = [{"id": i, "query": f"query number {i} about topic {i % 7}",
             "items": [f"item {j} of {i}" for j in range(6)], "label_token_ids": [YES, NO]}
            for i in range(600)]
    process, output = run_job("score", rows, tmp_path, wait=False)
    try:
        deadline, victim = time.monotonic() + 300, None
        while victim is None and time.monotonic() < deadline and process.poll() is None:
            victim = next(iter(_score_actor_pids()), None)
            time.sleep(0.2)
        assert victim is not None, "no scoring actor appeared"
        time.sleep(1)  # it has taken work
        assert process.poll() is None, "the job ended before the kill"
        os.kill(victim, signal.SIGKILL)
        replacements = set()
        while process.poll() is None and time.monotonic() < deadline + 600:
            replacements |= _score_actor_pids() - {victim}
            time.sleep(0.2)
        log = (tmp_path / "score.log").read_text()
        assert process.returncode == 0, log[-3000:]
        # A new actor took the killed one's place: rows were left to score when it died.
        assert replacements, "no replacement actor: the kill came after the last row"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    ids = pq.read_table(output, columns=["id", "error"]).to_pydict()
    assert sorted(ids["id"]) == list(range(len(rows)))  # each row once
    assert ids["error"] == [None] * len(rows)


def test_a_stopped_job_resumes_with_the_rows_it_lacks(tmp_path):
    """The driver dies mid-job (SIGKILL, its local Ray with it); --resume into the same folder
    keeps the files it finished, scores the rest, and every row is there once."""
    rows = [{"id": i, "query": f"query number {i}",
             "items": [f"item {j} of {i}" for j in range(6)], "label_token_ids": [YES, NO]}
            for i in range(600)]
    process, output = run_job("score", rows, tmp_path, wait=False)
    try:
        deadline = time.monotonic() + 600
        while process.poll() is None and time.monotonic() < deadline and not (
                output.exists() and any(output.glob("*.parquet"))):
            time.sleep(0.2)
        assert process.poll() is None, "the job ended before the kill"
        kill_all([psutil.Process(process.pid), *psutil.Process(process.pid).children(True)])
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    kept = {p.name for p in output.glob("*.parquet")}
    assert kept  # the stopped run finished some files: they stay
    out, summary = run_job("score", rows, tmp_path, "--resume")
    assert sorted(out) == list(range(len(rows)))  # each row once
    assert summary["rows"] == len(rows) and summary["error_rows"] == 0
    assert kept & {p.name for p in output.glob("*.parquet")}  # not started over
