"""Every bad input gets a 4xx with the OpenAI error envelope naming the field, over real HTTP."""

import json

import pytest

from tests.cpu.test_docs_page import PAGES, assert_page_is_self_contained

V = 49152  # SmolLM2 vocabulary
OK = {"query": "Is it?", "items": ["yes"], "label_token_ids": [10539, 5230]}


def _with(**changes):
    body = {**OK, **changes}
    return {k: v for k, v in body.items() if v is not _DROP}


_DROP = object()

CASES = [
    ("labels missing", _with(label_token_ids=_DROP), 400, "label_token_ids"),
    ("labels empty", _with(label_token_ids=[]), 400, "label_token_ids"),
    ("label too big", _with(label_token_ids=[1, V]), 400, "label_token_ids[1]"),
    ("label negative", _with(label_token_ids=[-1]), 400, "label_token_ids[0]"),
    ("labels duplicated", _with(label_token_ids=[5, 5]), 400, "label_token_ids"),
    ("label is a string", _with(label_token_ids=["Yes"]), 400, "label_token_ids[0]"),
    ("label is a bool", _with(label_token_ids=[True]), 400, "label_token_ids[0]"),
    ("label is a float", _with(label_token_ids=[1.5]), 400, "label_token_ids[0]"),
    ("labels not a list", _with(label_token_ids=7), 400, "label_token_ids"),
    ("too many labels", _with(label_token_ids=list(range(65))), 400, "label_token_ids"),
    ("items missing", _with(items=_DROP), 400, "items"),
    ("items null", _with(items=None), 400, "items"),
    ("items a number", _with(items=5), 400, "items"),
    ("items mixed kinds", _with(items=["a", [1]]), 400, "items"),
    ("text query, token items", _with(items=[[1, 2]]), 400, "items"),
    ("token query, text items", _with(query=[1, 2]), 400, "items"),
    ("query an object", _with(query={"a": 1}), 400, "query"),
    ("item token too big", _with(query=[1], items=[[1, V]]), 400, "items[0][1]"),
    ("query token negative", _with(query=[-3], items=[[1]]), 400, "query[0]"),
    ("unknown field", _with(temperature=0.5), 400, "temperature"),
    ("apply_softmax not a bool", _with(apply_softmax="yes"), 400, "apply_softmax"),
    ("item_first not a bool", _with(item_first=1), 400, "item_first"),
    ("model not a string", _with(model=3), 400, "model"),
    ("too many items", _with(items=["a"] * 10_001), 413, "items"),
    ("too many tokens", _with(query=[1], items=[[2] * 1000] * 40), 413, "items"),
    ("query + item beyond the context", _with(query=[1], items=[[2] * 8192]), 400, "items[0]"),
    ("empty query and empty item", _with(query=[], items=[[1], []]), 400, "items[1]"),
]


@pytest.mark.parametrize("body,status,param", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_request_names_the_field(client, body, status, param):
    r = client.post("/v1/score", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param
    assert error["code"] == status
    assert error["message"] and error["type"]


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"[1, 2]", b'{"query": "a", "items": ["b"], "label_token_ids": [NaN]}',
     b"", b'{"query": "a",', b"\xff\xfe"],
    ids=["garbage", "array", "NaN", "empty", "truncated", "not utf-8"],
)
def test_body_that_is_not_a_json_object(client, raw):
    r = client.post("/v1/score", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "body"


def test_body_too_large(client):
    big = json.dumps({**OK, "items": ["x" * (17 * 1024 * 1024)]})
    r = client.post("/v1/score", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["param"] == "body"


def test_unknown_route_and_wrong_method_use_the_envelope(client):
    assert client.get("/v2/nothing").json()["error"]["code"] == 404
    r = client.get("/v1/score")
    assert r.status_code == 405 and r.json()["error"]["code"] == 405


@pytest.mark.parametrize("page", sorted(PAGES))
def test_docs_pages_load_their_assets_from_the_service(client, page):
    # Under serve.ingress (the app is pickled into the replica), as on an offline cluster.
    assert_page_is_self_contained(client, page)


def test_service_still_healthy_after_bad_inputs(client):
    assert client.get("/health").status_code == 200
    assert client.post("/v1/score", json=OK).status_code == 200
