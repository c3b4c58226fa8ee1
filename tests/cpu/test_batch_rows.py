"""A dataset row as an API body and an API answer as output columns (ranker_batch/rows.py), and
the CLI's refusal of an output folder that already holds files: no Ray needed."""

import json
import subprocess
import sys

from ranker_batch.rows import answer_columns, request_body
from tools import REPO_ROOT


def test_a_row_is_the_body_of_its_present_fields():
    row = {"id": 7, "query": "q", "items": ["a", "b"], "label_token_ids": None,
           "apply_softmax": True, "item_first": None, "extra": "ignored"}
    assert json.loads(request_body("score", row)) == {"query": "q", "items": ["a", "b"],
                                                      "apply_softmax": True}
    row = {"query": [1, 2], "documents": ["d"], "instruction": "i", "id": "x"}
    assert json.loads(request_body("rerank", row)) == {"query": [1, 2], "documents": ["d"],
                                                       "instruction": "i"}


def test_rerank_answers_come_back_in_document_order():
    response = {"results": [{"index": 2, "relevance_score": 0.9},
                            {"index": 0, "relevance_score": 0.5},
                            {"index": 1, "relevance_score": 0.1}],
                "usage": {"total_tokens": 42}}
    assert answer_columns("rerank", response) == ([0.5, 0.1, 0.9], 42, None)
    for result, raw in zip(response["results"], (0.7, 0.4, 0.2)):  # a calibrated answer
        result["raw_score"] = raw
    assert answer_columns("rerank", response) == ([0.5, 0.1, 0.9], 42, [0.4, 0.2, 0.7])
    score = {"scores": [[0.2, 0.8]], "usage": {"prompt_tokens": 9, "total_tokens": 9}}
    assert answer_columns("score", score) == ([[0.2, 0.8]], 9, None)


def test_the_cli_refuses_an_output_folder_with_files(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "part-0.parquet").write_bytes(b"")
    r = subprocess.run([sys.executable, "-m", "ranker_batch", "--config",
                        str(REPO_ROOT / "configs" / "score.yaml"), "--kind", "score",
                        "--input", str(tmp_path / "in.parquet"), "--output",
                        str(tmp_path / "out")], cwd=REPO_ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "is not empty" in r.stderr


def test_the_batch_job_imports_nothing_of_the_http_side():
    """The job runs the service's request path (serve_app/requests.py), not its ingress: neither
    the ingress, its metrics nor Ray Serve is imported by it."""
    code = ("import sys, ranker_batch.job, ranker_batch.stages, serve_app.requests; "
            "print(sorted(m for m in sys.modules if m.startswith(('serve_app.ingress', "
            "'serve_app.metrics', 'ray.serve'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                       text=True, check=True)
    assert r.stdout.strip() == "[]"
