"""/v1/score semantics over real HTTP against the default model (SmolLM2-135M-Instruct), and
splitting a request into several sequences against the small random model."""

import math

import httpx
import pytest
from transformers import AutoTokenizer

from tools import DEFAULT_MODEL

YES, NO = 10539, 5230
LABELS = [YES, NO]


def _score(client, **body):
    r = client.post("/v1/score", json={"label_token_ids": LABELS, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_response_shape_usage_and_model(client):
    out = _score(client, query="Is the sky blue?", items=["Yes it is.", "No.", "Maybe"])
    assert out["object"] == "scoring"
    assert out["model"] == "smollm2-135m-instruct"
    assert len(out["scores"]) == 3 and all(len(row) == 2 for row in out["scores"])
    usage = out["usage"]
    assert usage["completion_tokens"] == 0
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0
    assert _score(client, query="q", items=["a"], model="my-ranker")["model"] == "my-ranker"


def test_server_timing_header_breaks_down_the_ingress_time(client):
    r = client.post("/v1/score",
                    json={"query": "q", "items": ["a", "b"], "label_token_ids": LABELS})
    parts = dict(p.strip().split(";dur=") for p in r.headers["server-timing"].split(","))
    assert set(parts) == {"parse", "tokenize", "pack", "quota", "worker", "hop", "queue",
                          "compute", "ingress"}
    ms = {k: float(v) for k, v in parts.items()}
    assert all(v >= 0 for v in ms.values())
    assert (ms["parse"] + ms["tokenize"] + ms["pack"] + ms["quota"] + ms["worker"]
            <= ms["ingress"] + 0.05)
    # The scorer's own split of the worker call: it did compute, and the parts add up.
    assert ms["compute"] > 0
    assert ms["hop"] + ms["queue"] + ms["compute"] == pytest.approx(ms["worker"], abs=0.05)


def test_apply_softmax_false_gives_full_vocab_probabilities(client):
    raw = _score(client, query="Is the sky blue?", items=["Yes.", "The sky"])["scores"]
    soft = _score(client, query="Is the sky blue?", items=["Yes.", "The sky"],
                  apply_softmax=True)["scores"]
    for raw_row, soft_row in zip(raw, soft):
        assert all(0 < p < 1 for p in raw_row) and sum(raw_row) < 1
        assert math.isclose(sum(soft_row), 1.0, rel_tol=1e-9)
        # The full-vocabulary normaliser cancels in the label softmax.
        total = sum(raw_row)
        for p_raw, p_soft in zip(raw_row, soft_row):
            assert math.isclose(p_raw / total, p_soft, rel_tol=1e-6)


def test_empty_items_and_single_string_item(client):
    assert _score(client, query="q", items=[])["scores"] == []
    one = _score(client, query="Is the sky blue?", items="Yes.")["scores"]
    many = _score(client, query="Is the sky blue?", items=["Yes.", "No."])["scores"]
    assert len(one) == 1
    # The same bits alone or beside another item (docs/OPERATIONS.md, "Deterministic scores").
    assert one[0] == many[0]


def test_token_ids_equal_text_tokenized_by_transformers(client):
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL, local_files_only=True)
    query, items = "Is the sky blue?", [" Yes, it is.", " No, it is green."]
    text = _score(client, query=query, items=items)["scores"]
    ids = _score(client, query=tok(query)["input_ids"],
                 items=[tok(i, add_special_tokens=False)["input_ids"] for i in items])["scores"]
    assert ids == text


def test_item_first_scores_item_then_query(client):
    query, items = [504, 3575, 314], [[2418, 28], [1345]]
    out = _score(client, query=query, items=items, item_first=True)["scores"]
    for item, row in zip(items, out):
        # item + query as the query of a request with one empty item: scored at its last token.
        alone = _score(client, query=item + query, items=[[]])["scores"][0]
        assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(row, alone))


def test_request_split_into_several_sequences_keeps_item_order(small_server_url):
    # 24 items × 60 tokens exceed max_seq_tokens (1024 on the small model's service): the
    # request is split into two sequences and merged back in item order.
    query = list(range(100, 130))
    items = [[1000 + 7 * k + j for j in range(60)] for k in range(24)]
    with httpx.Client(base_url=small_server_url, timeout=120) as small:
        packed = _score(small, query=query, items=items)
        assert packed["usage"]["prompt_tokens"] > 1024  # more than one sequence
        for k in (0, 13, 23):
            alone = _score(small, query=query, items=[items[k]])["scores"][0]
            assert packed["scores"][k] == alone


def test_sanity_true_answer_gets_the_highest_yes(client):
    # A few-shot yes/no prompt; the 135M model puts the most "Yes" on the true capital.
    query = ("Q: Is Rome the capital of Italy?\nA: Yes\nQ: Is Madrid the capital of Germany?\n"
             "A: No\nQ: Is Tokyo the capital of Japan?\nA: Yes\nQ: Is")
    cities = [" Berlin", " Paris", " London", " Lyon"]
    items = [f"{c} the capital of France?\nA:" for c in cities]
    labels = [9230, 2838]  # " Yes", " No"
    r = client.post("/v1/score", json={"query": query, "items": items, "label_token_ids": labels,
                                       "apply_softmax": True})
    yes = [row[0] for row in r.json()["scores"]]
    assert cities[yes.index(max(yes))] == " Paris"


def test_models_health_and_docs(client):
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "smollm2-135m-instruct"
    assert client.get("/health").json()["status"] == "ok"
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    assert "label_token_ids" in str(spec["paths"]["/v1/score"])
