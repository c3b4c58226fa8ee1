"""Fuzzing and nasty hand-written inputs over real HTTP (the `serve run` service of conftest.py,
API keys on: every request sends a valid key, so the checks run behind the key check).

The rules checked on every response: no 5xx; a 4xx carries the OpenAI envelope
`{"error": {"message", "type", "param", "code"}}` with a string message and `code` equal to the
status; a 200 from /v1/score has one row per item and one probability in [0, 1] per label; no
request hangs (each has a REQUEST_TIMEOUT_S timeout, and a timeout fails the test); the service
is healthy and scores a normal request afterwards.

Two generators share FUZZ_CASES requests (default 300: about 8 s of requests on 2 cores):
- schemathesis reads /openapi.json and generates cases for every operation: schema-valid and
  schema-violating bodies for POST /v1/score, and GET /v1/models and /health;
- a hypothesis strategy of near-valid /v1/score bodies (token ids and labels around the
  vocabulary bounds, text of any code point including lone surrogates, empty query or items,
  one field replaced by arbitrary JSON, unknown or missing keys), which reaches the model
  much more often than schema-driven data does.
Sizes stay small (at most 4 items of at most 12 tokens or 24 characters): the model runs on CPU;
the limits themselves are exercised by the hand-written cases below.

Long run (about 5 min on 2 cores; 4 of them fuzzing):
    FUZZ_CASES=10000 RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 \\
        .venv/bin/python -m pytest tests/cpu/test_fuzz_http.py -q -p no:cacheprovider -s
(`-s` prints the status-code counts of the fuzzed requests.)
"""

import collections
import json
import math
import os
import re
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

V = 49152  # SmolLM2 vocabulary
YES, NO = 10539, 5230
OK = {"query": "Is it?", "items": ["yes"], "label_token_ids": [YES, NO]}
REQUEST_TIMEOUT_S = 30.0
FUZZ_CASES = int(os.environ.get("FUZZ_CASES", "300"))
SCHEMA_CASES = FUZZ_CASES // 2
NEAR_VALID_CASES = FUZZ_CASES - SCHEMA_CASES
FIELDS = {"query", "items", "label_token_ids", "apply_softmax", "item_first", "model"}

STATUSES: collections.Counter = collections.Counter()  # (generator, status) of fuzzed requests


def _fuzz_settings(max_examples: int):
    # No example database: nothing is written into the repo; a failure prints its seed instead.
    return settings(max_examples=max_examples, deadline=None, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


# ---- response checks shared by every test ----------------------------------------------------

def check_error(status: int, content: bytes, headers) -> dict:
    assert 400 <= status < 500, f"expected a 4xx, got {status}: {content[:500]!r}"
    assert headers.get("content-type", "").startswith("application/json"), headers
    error = json.loads(content)["error"]
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert type(error["code"]) is int and error["code"] == status, error
    return error


def check_scores(out: dict, body: dict) -> None:
    items = body.get("items")
    n_items = 1 if isinstance(items, str) else len(items)
    labels = body["label_token_ids"]
    assert out["object"] == "scoring"
    assert out["model"] == (body.get("model") or "smollm2-135m-instruct")
    assert len(out["scores"]) == n_items
    for row in out["scores"]:
        assert len(row) == len(labels)
        assert all(isinstance(p, float) and 0.0 <= p <= 1.0 for p in row), row
        if body.get("apply_softmax"):
            assert math.isclose(sum(row), 1.0, rel_tol=1e-6), row
    usage = out["usage"]
    assert usage["completion_tokens"] == 0
    assert usage["prompt_tokens"] == usage["total_tokens"] >= 0
    assert (usage["prompt_tokens"] > 0) == (n_items > 0)


def check_response(method: str, path: str, status: int, content: bytes, headers,
                   body=None) -> None:
    assert status < 500, f"{method} {path} -> {status}: {content[:2000]!r}\nbody: {body!r:.2000}"
    if status >= 400:
        error = check_error(status, content, headers)
        if path == "/v1/score" and status in (400, 413) and isinstance(body, dict):
            # The param names a key of the request, a part of a field, or the body itself.
            param = error["param"] or "body"
            assert param in body or re.split(r"[\[.]", param)[0] in FIELDS | {"body"}, error
        return
    assert status == 200, f"{method} {path} -> {status}: {content[:500]!r}"
    out = json.loads(content)
    if path == "/v1/score":
        check_scores(out, body)
    elif path == "/health":
        assert out["status"] == "ok"
    elif path == "/v1/models":
        assert out["data"][0]["id"] == "smollm2-135m-instruct"


def post_raw(client, content: bytes,
             content_type: str | None = "application/json") -> tuple[httpx.Response, float]:
    headers = {} if content_type is None else {"content-type": content_type}
    started = time.monotonic()
    try:
        r = client.post("/v1/score", content=content, headers=headers, timeout=REQUEST_TIMEOUT_S)
    except httpx.TimeoutException:
        pytest.fail(f"no answer within {REQUEST_TIMEOUT_S} s (a hang)")
    return r, time.monotonic() - started


# ---- schemathesis: cases generated from /openapi.json ----------------------------------------

@pytest.fixture(scope="module")
def schema_cases(server_url, auth_headers):
    schema = schemathesis.openapi.from_url(f"{server_url}/openapi.json", timeout=30,
                                           headers=auth_headers)
    score = schema["/v1/score"]["POST"]
    gets = st.one_of(schema["/v1/models"]["GET"].as_strategy(),
                     schema["/health"]["GET"].as_strategy())
    modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    posts = [score.as_strategy(generation_mode=mode) for mode in modes]
    # Half schema-valid bodies, half schema-violating ones; the GET endpoints take no input, so
    # hypothesis sends each of them once (it does not repeat an identical case).
    return st.one_of(*posts, *posts, *posts, *posts, gets)


@_fuzz_settings(SCHEMA_CASES)
@given(data=st.data())
def test_schemathesis_cases(schema_cases, server_url, auth_headers, data):
    case = data.draw(schema_cases, label="case")
    try:
        response = case.call(base_url=server_url, headers=auth_headers,
                             timeout=REQUEST_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - requests' timeouts and connection errors
        pytest.fail(f"{case.method} {case.path}: no answer ({type(exc).__name__}: {exc})")
    STATUSES["schemathesis", response.status_code] += 1
    body = case.body if case.method == "POST" else None
    check_response(case.method, case.path, response.status_code, response.content,
                   {k: v[0] for k, v in response.headers.items()}, body)
    case.validate_response(response, checks=[not_a_server_error, content_type_conformance,
                                             response_schema_conformance])


# ---- hypothesis: near-valid /v1/score bodies --------------------------------------------------

EDGE_IDS = [0, 1, V - 1, V, -1, 2**31, 2**63, -(2**63), 10**30]
NASTY_TEXT = ["", " ", "\u0000", "\ud800", "\udfff", "a\udc00b", "\u202e\u200fabc", "😀",
              "e\u0301", "\ufeff", "\uffff", "<|im_start|>", "\r\n\t", " Yes", "\x7f\x1b[0m"]

token_ids = st.one_of(st.integers(0, V - 1), st.integers(0, V - 1), st.sampled_from(EDGE_IDS))
# characters() without a codec includes every code point, lone surrogates too.
texts = st.one_of(st.text(st.characters(), max_size=24), st.sampled_from(NASTY_TEXT))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def near_valid_bodies(draw) -> dict:
    if draw(st.booleans()):
        query = draw(st.none() | texts)
        items = draw(texts | st.lists(texts, max_size=4))
    else:
        query = draw(st.none() | st.lists(token_ids, max_size=12))
        items = draw(st.lists(st.lists(token_ids, max_size=12), max_size=4))
    labels = st.sampled_from([YES, NO]) | token_ids
    body = {"items": items, "label_token_ids": draw(st.lists(labels, min_size=1, max_size=4))}
    if query is not None:
        body["query"] = query
    for flag in ("apply_softmax", "item_first"):
        if draw(st.booleans()):
            body[flag] = draw(st.booleans())
    if draw(st.integers(0, 4)) == 0:
        body["model"] = draw(texts)
    mutation = draw(st.sampled_from(["none", "none", "none", "replace", "drop", "extra"]))
    if mutation == "replace":
        body[draw(st.sampled_from(sorted(FIELDS)))] = draw(json_values)
    elif mutation == "drop":
        body.pop(draw(st.sampled_from(sorted(body))))
    elif mutation == "extra":
        body[draw(texts)] = draw(json_values)
    return body


def _encode(body: dict, ascii_only: bool) -> bytes:
    # Lone surrogates only travel as \u escapes (raw UTF-8 cannot carry them).
    try:
        return json.dumps(body, ensure_ascii=ascii_only).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(body).encode("utf-8")


@_fuzz_settings(NEAR_VALID_CASES)
@given(body=near_valid_bodies(), ascii_only=st.booleans())
def test_near_valid_bodies(client, body, ascii_only):
    r, _ = post_raw(client, _encode(body, ascii_only))
    STATUSES["near-valid", r.status_code] += 1
    check_response("POST", "/v1/score", r.status_code, r.content, r.headers, body)


# ---- hand-written nasty inputs ----------------------------------------------------------------

def _raw(fields: str, labels: str = '"label_token_ids": [10539, 5230], ') -> bytes:
    """A body from literal JSON text (for what json.dumps cannot write), labels first."""
    return ("{" + labels + fields + "}").encode()


def _json(**fields) -> bytes:
    return json.dumps({**OK, **fields}).encode()


DEEP = 100_000
# (id, raw body, expected status, expected param or None for any)
NASTY = [
    # Nesting deeper than the recursion limit fails in json.loads (RecursionError): 400.
    ("100k [", b"[" * DEEP, 400, "body"),
    ("100k [ balanced", b"[" * DEEP + b"]" * DEEP, 400, "body"),
    ("100k { in query", _raw('"items": ["x"], "query": ' + '{"a": ' * DEEP + "1" + "}" * DEEP),
     400, "body"),
    ("100k [ in items", _raw('"items": ' + "[" * DEEP + "]" * DEEP), 400, "body"),
    ("500 levels in items", _raw('"items": ' + "[" * 500 + "]" * 500), 400, "items"),
    # Numbers: over 4300 digits is a ValueError in int(); exponents overflow to a float.
    ("100k-digit label",
     _raw('"items": ["x"], "label_token_ids": [' + "9" * DEEP + "]", labels=""), 400, "body"),
    ("1e999999 label", _raw('"items": ["x"], "label_token_ids": [1e999999]', labels=""), 400,
     "label_token_ids[0]"),
    ("-1e400 token", _raw('"query": [1], "items": [[-1e400]]'), 400, "items"),
    ("huge float query", _raw('"query": [1' + "0" * 400 + '.5], "items": [[1]]'), 400, "query"),
    ("Infinity label", _raw('"items": ["x"], "label_token_ids": [Infinity]', labels=""), 400,
     "body"),
    ("-Infinity token", _raw('"query": [-Infinity], "items": [[1]]'), 400, "body"),
    ("NaN apply_softmax", _raw('"items": ["x"], "apply_softmax": NaN'), 400, "body"),
    ("nan lowercase", _raw('"items": ["x"], "apply_softmax": nan'), 400, "body"),
    # Token ids far outside the vocabulary.
    ("label 2**63", _json(label_token_ids=[YES, 2**63]), 400, "label_token_ids[1]"),
    ("label -2**63", _json(label_token_ids=[-(2**63)]), 400, "label_token_ids[0]"),
    ("label 10**30", _json(label_token_ids=[10**30]), 400, "label_token_ids[0]"),
    ("label 2**63-1", _json(label_token_ids=[2**63 - 1]), 400, "label_token_ids[0]"),
    ("query id 2**64", _json(query=[2**64], items=[[1]]), 400, "query[0]"),
    ("item id -2**63", _json(query=[1], items=[[1, -(2**63)]]), 400, "items[0][1]"),
    ("item id 10**30", _json(query=[1], items=[[2], [10**30]]), 400, "items[1][0]"),
    # Text that is Unicode, however odd, is scored.
    ("NUL in text", _json(query="a\u0000b", items=["\u0000", "x\u0000"]), 200, None),
    ("control chars", _json(items=["\x01\x07\x1b[31m\x7f", "\r\n\t\x0b\x0c"]), 200, None),
    ("RTL marks", _json(query="\u202eabc\u200f", items=["\u200f\u202b\u05e9\u05dc\u05d5\u05dd"]),
     200, None),
    ("emoji", _json(items=["😀", "👩‍👩‍👧‍👦", "🇫🇷"]), 200, None),
    ("escaped surrogate pair", _raw('"query": "\\ud83d\\ude00", "items": ["\\ud83d\\ude00"]'),
     200, None),
    ("BOM and noncharacters", _json(query="\ufeff", items=["\uffff\ufffe", "\U0010ffff"]), 200,
     None),
    ("combining marks", _json(items=["e" + "\u0301" * 100]), 200, None),
    ("special-token text", _json(items=["<|im_start|>", "<|endoftext|>"]), 200, None),
    # Lone surrogates (only as \u escapes) are not Unicode text: 400 naming the field.
    ("lone high surrogate item", _raw('"query": "q", "items": ["ok", "a\\ud800"]'), 400,
     "items[1]"),
    ("lone low surrogate query", _raw('"query": "\\udfff", "items": ["x"]'), 400, "query"),
    ("reversed surrogate pair", _raw('"items": "\\udc00\\ud800"'), 400, "items[0]"),
    ("lone surrogate model", _raw('"query": [1], "items": [[2]], "model": "\\ud800"'), 400,
     "model"),
    ("lone surrogate key", _raw('"items": ["x"], "\\ud800": 1'), 400, "body"),  # pydantic
    # Bytes that are not UTF-8 JSON text.
    # json.loads decodes bytes with errors="surrogatepass": encoded surrogates are let through.
    ("UTF-8 encoded surrogate", _raw('"items": ["x"], "model": "').rstrip(b"}") + b'\xed\xa0\x80"}',
     400, "model"),
    ("overlong UTF-8", _raw('"items": ["x"], "model": "').rstrip(b"}") + b'\xc0\xaf"}', 400,
     "body"),
    ("raw control char in string", b'{"items": ["a\x01b"], "label_token_ids": [1]}', 400,
     "body"),
    ("trailing garbage", _json() + b" x", 400, "body"),
    ("two objects", _json() + _json(), 400, "body"),
    # json.loads also takes a UTF-8 BOM and UTF-16/32 (RFC 8259 sec. 8.1 lets it): accepted.
    ("UTF-8 BOM", b"\xef\xbb\xbf" + _json(), 200, None),
    ("UTF-16 body", json.dumps(OK).encode("utf-16"), 200, None),
    # Empty text: the query gets no special tokens on SmolLM2, so "" is zero tokens.
    ("empty query and item", _json(query="", items=[""]), 400, "items[0]"),
    ("empty query, item string", _json(query="", items=""), 400, "items[0]"),
    ("no query, empty item", json.dumps({"items": ["a", ""], "label_token_ids": [1]}).encode(),
     400, "items[1]"),
    ("empty query, no items", _json(query="", items=[]), 200, None),
    ("empty item scored on the query", _json(query="q", items=["", "a"]), 200, None),
    ("empty token query and items", _json(query=[], items=[]), 200, None),
    ("100 empty items", _json(query=[1, 2], items=[[]] * 100), 200, None),
    ("item_first, empty item", _json(query=[1, 2], items=[[]], item_first=True), 200, None),
    ("item_first, all empty", _json(query=[], items=[[3], []], item_first=True), 400,
     "items[1]"),
    # Duplicate keys are refused, naming the key, in any object.
    ("duplicate items", _raw('"query": "q", "items": ["a"], "items": ["b", "c"]'), 400, "items"),
    ("duplicate labels, same value",
     b'{"items": ["a"], "label_token_ids": [1], "label_token_ids": [1]}', 400,
     "label_token_ids"),
    ("duplicate unknown key", _raw('"items": ["a"], "x": 1, "x": 2'), 400, "x"),
    ("duplicate key nested", _raw('"items": ["a"], "query": {"a": 1, "a": 2}'), 400, "a"),
    ("duplicate surrogate key", _raw('"items": ["a"], "\\udfff": 1, "\\udfff": 2'), 400,
     "\\udfff"),
    # Many keys, labels at the limit, a long model name.
    ("100k unknown keys", _raw('"items": ["x"], ' + ", ".join(f'"k{i}": {i}' for i in range(DEEP))),
     400, None),
    ("64 labels", _json(label_token_ids=list(range(100, 164)), apply_softmax=True), 200, None),
    ("1 MB model name", _json(model="m" * 1_000_000), 200, None),
]


@pytest.mark.parametrize("raw,status,param", [c[1:] for c in NASTY], ids=[c[0] for c in NASTY])
def test_nasty_body(client, raw, status, param):
    r, elapsed = post_raw(client, raw)
    assert r.status_code == status, r.text[:2000]
    if status == 200:
        check_scores(r.json(), json.loads(raw))  # json.loads reads a BOM or UTF-16 too
    else:
        error = check_error(r.status_code, r.content, r.headers)
        if param is not None:
            assert error["param"] == param, error
    assert elapsed < 10, f"{elapsed:.1f} s"


@pytest.mark.parametrize("items", [["a"] * 100_000, [[1]] * 100_000], ids=["text", "token ids"])
def test_100k_items_rejected_quickly_by_the_item_limit(client, items):
    query = "q" if isinstance(items[0], str) else [1]
    r, elapsed = post_raw(client, _json(query=query, items=items))
    error = check_error(r.status_code, r.content, r.headers)
    assert r.status_code == 413 and error["param"] == "items", error
    assert elapsed < 5, f"{elapsed:.1f} s"


def test_10mb_text_item_is_rejected_or_scored_in_bounded_time(client):
    # Under max_body_bytes, so it is tokenized (about 10 s on 2 cores: 2.5M tokens), then
    # refused by max_tokens_per_request.
    text = "x" * 10_000_000
    r, elapsed = post_raw(client, _json(items=[text]))
    if r.status_code == 200:
        check_scores(r.json(), {**OK, "items": [text]})
    else:
        error = check_error(r.status_code, r.content, r.headers)
        assert r.status_code == 413 and error["param"] == "items", error
    assert elapsed < REQUEST_TIMEOUT_S, f"{elapsed:.1f} s"


# Content type is not checked: the body is parsed as JSON whatever the header says (200), and a
# body that is not JSON is a 400 like any other.
@pytest.mark.parametrize(
    "content_type,raw,status",
    [
        ("text/plain", _json(), 200),
        ("application/x-www-form-urlencoded", _json(), 200),
        ("multipart/form-data; boundary=xyz", _json(), 200),
        ("application/json; charset=latin-1", _json(), 200),
        (None, _json(), 200),
        ("application/xml", b"<score><items>a</items></score>", 400),
        ("application/x-www-form-urlencoded", b"query=q&items=a&label_token_ids=1", 400),
    ],
    ids=["text/plain", "form JSON", "multipart JSON", "latin-1 JSON", "no header", "xml",
         "real form"],
)
def test_content_type_is_not_required(client, content_type, raw, status):
    r, _ = post_raw(client, raw, content_type)
    assert r.status_code == status, r.text
    if status >= 400:
        assert check_error(r.status_code, r.content, r.headers)["param"] == "body"


@pytest.mark.parametrize("method,path,status", [
    ("PUT", "/v1/score", 405), ("DELETE", "/v1/score", 405), ("PATCH", "/v1/score", 405),
    ("POST", "/health", 405), ("POST", "/v1/models", 405), ("GET", "/v1/score/x", 404),
    ("GET", "/%00", 404), ("GET", "/" + "a" * 4000, 404),
])
def test_wrong_methods_and_routes_use_the_envelope(client, method, path, status):
    r = client.request(method, path, content=_json(), timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == status, r.text
    check_error(r.status_code, r.content, r.headers)


def test_service_healthy_after_fuzzing(client):
    if STATUSES:
        print("\nfuzzed requests by (generator, status):", dict(sorted(STATUSES.items())))
    assert client.get("/health", timeout=REQUEST_TIMEOUT_S).status_code == 200
    r = client.post("/v1/score", json=OK, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, r.text
    check_scores(r.json(), OK)
