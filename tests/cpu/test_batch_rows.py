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


def test_a_prepared_row_is_plain_columns_that_give_back_its_tokens():
    """Between the job's stages (ranker_batch/stages.py) a row is the request body and its
    tokens as Arrow columns, no pickled object: each row's columns give back exactly what the
    service's request path tokenizes for it; a refused row has its error and no columns."""
    import pyarrow as pa

    from ranker_batch.stages import PREPARED, Prepare, tokens_of
    from serve_app.requests import RequestPath
    from serve_app.routes import RERANK_V1, SCORE
    from serve_app.validate import read_body
    from tools.configs import shipped_app_config

    app = shipped_app_config("score.yaml")
    path = RequestPath(app)
    long = "word " * 6000  # two chunks in the model's window
    tables = [  # (kind, its route, rows of one Arrow type each): the last one is refused
        ("score", SCORE, [{"id": 1, "query": "is it?", "items": ["yes", "no, not at all"],
                           "label_token_ids": [10539, 5230]},
                          {"id": 3, "query": "q", "items": ["x"], "label_token_ids": [-1]}]),
        ("score", SCORE, [{"id": 2, "query": [5, 6, 7], "items": [[8], [9, 10]],
                           "label_token_ids": [3, 4], "item_first": True},
                          {"id": 3, "query": [5], "items": [[8]], "label_token_ids": [-1],
                           "item_first": False}]),
        ("rerank", RERANK_V1, [{"id": 1, "query": "q", "documents": ["short", long],
                                "max_tokens_per_doc": None, "max_chunks_per_doc": None},
                               {"id": 2, "query": "q", "documents": ["a b c d e f", long],
                                "max_tokens_per_doc": 3, "max_chunks_per_doc": None},
                               {"id": 4, "query": "q", "documents": ["x", long],
                                "max_tokens_per_doc": None, "max_chunks_per_doc": 1},
                               {"id": 3, "query": "q", "documents": ["d"],
                                "max_tokens_per_doc": 0, "max_chunks_per_doc": None}]),
    ]
    seen = set()
    for kind, route, rows in tables:
        out = Prepare(app.model_dump(), kind, "id")(pa.Table.from_pylist(rows))
        assert out.schema == pa.schema([pa.field("id", pa.int64()), *PREPARED,
                                        pa.field("error", pa.string())])
        for row, prepared in zip(rows, out.to_pylist(), strict=True):
            if row["id"] == 3:  # not a valid request: the API's 400, nothing else
                assert prepared["error"].startswith("400 ")
                assert all(prepared[name] is None for name in PREPARED.names)
                continue
            assert prepared["error"] is None
            own, req, _ = path.parse(route, read_body(request_body(kind, row), path.limits))
            tokens = tokens_of(prepared)
            assert tokens == own.tokenize_now(req), (kind, row["id"])
            seen.update(name for name in ("documents", "truncated", "capped")
                        if getattr(tokens, name))
    assert seen == {"documents", "truncated", "capped"}  # the rerank fields came through too
