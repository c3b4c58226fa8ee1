"""/v1/rerank and /v2/rerank over real HTTP (configs/score.yaml: SmolLM2-135M-Instruct with the
yes_no template), with the clients users point at such a service: the cohere SDK (v2 and v1
clients) and plain httpx for Jina's shape. Requests stay small: every one runs the real model."""

from __future__ import annotations

import cohere
import pytest

from serve_app.protocol import RerankRequest
from serve_app.rerank import RerankInput, build_response

QUERY = "What is the capital of France?"
DOCS = [
    "Bananas are rich in potassium.",
    "Paris is the capital and most populous city of France.",
    "The stock market fell on Monday.",
]


@pytest.fixture(scope="module")
def co_v2(server_url, api_keys):
    return cohere.ClientV2(base_url=server_url, api_key=api_keys["team-a"], timeout=60)


@pytest.fixture(scope="module")
def co_v1(server_url, api_keys):
    return cohere.Client(base_url=server_url, api_key=api_keys["team-b"], timeout=60)


def _rerank(client, route="/v2/rerank", **body):
    r = client.post(route, json={"model": "m", **body})
    assert r.status_code == 200, r.text
    return r.json()


def _assert_sorted(results):
    keys = [(-r.relevance_score, r.index) if hasattr(r, "index") else
            (-r["relevance_score"], r["index"]) for r in results]
    assert keys == sorted(keys)  # by score, highest first; equal scores by index


def test_cohere_client_v2(co_v2):
    out = co_v2.rerank(model="smollm2-135m-instruct", query=QUERY, documents=DOCS)
    assert sorted(r.index for r in out.results) == [0, 1, 2]
    assert all(0.0 < r.relevance_score < 1.0 for r in out.results)
    _assert_sorted(out.results)
    assert out.meta.api_version.version == "2"
    assert out.meta.billed_units.search_units == 1
    top = co_v2.rerank(model="smollm2-135m-instruct", query=QUERY, documents=DOCS, top_n=2)
    assert [(r.index, r.relevance_score) for r in top.results] == \
        [(r.index, r.relevance_score) for r in out.results[:2]]


def test_cohere_client_v1_with_object_documents_and_return_documents(co_v1):
    docs = [DOCS[0], {"text": DOCS[1]}, {"text": DOCS[2]}]
    out = co_v1.rerank(model="smollm2-135m-instruct", query=QUERY, documents=docs,
                       return_documents=True, top_n=3)
    assert len(out.results) == 3
    _assert_sorted(out.results)
    for r in out.results:
        assert r.document.text == DOCS[r.index]
    assert out.meta.api_version.version == "1"
    bare = co_v1.rerank(model="m", query=QUERY, documents=DOCS)
    assert all(r.document is None for r in bare.results)


def test_v1_and_v2_and_string_or_object_documents_score_the_same(client):
    v2 = _rerank(client, query=QUERY, documents=DOCS)["results"]
    v1 = _rerank(client, "/v1/rerank", query=QUERY,
                 documents=[{"text": d} for d in DOCS])["results"]
    assert [r["index"] for r in v1] == [r["index"] for r in v2]
    for a, b in zip(v1, v2):
        assert a["relevance_score"] == b["relevance_score"]


def test_jina_shape_over_httpx(client):
    # The client sends its API key as Jina's clients do (`Authorization: Bearer`); a wrong one
    # is a 401 (tests/cpu/test_api_keys_http.py).
    r = client.post("/v1/rerank", json={"model": "jina-like", "query": QUERY, "documents": DOCS,
                                        "top_n": 2, "return_documents": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model"] == "jina-like"
    assert out["usage"]["total_tokens"] == out["meta"]["tokens"]["input_tokens"] > 0
    assert len(out["results"]) == 2
    for res in out["results"]:
        assert res["document"] == {"text": DOCS[res["index"]]}
    assert isinstance(out["id"], str) and out["id"]
    # Server-Timing as for /v1/score.
    parts = dict(p.strip().split(";dur=") for p in r.headers["server-timing"].split(","))
    assert set(parts) == {"parse", "tokenize", "pack", "quota", "worker", "hop", "queue",
                          "compute", "ingress"}


def test_empty_documents_and_top_n_larger_than_documents(client):
    for route in ("/v1/rerank", "/v2/rerank"):
        out = _rerank(client, route, query=QUERY, documents=[])
        assert out["results"] == [] and out["usage"]["total_tokens"] == 0
    assert len(_rerank(client, query=QUERY, documents=DOCS[:2], top_n=10)["results"]) == 2


def test_identical_documents_tie_and_keep_index_order(client):
    docs = ["Lyon is a city in France.", "Paris is in France.", "Lyon is a city in France."]
    results = _rerank(client, query=QUERY, documents=docs)["results"]
    _assert_sorted(results)
    by_index = {r["index"]: r["relevance_score"] for r in results}
    assert by_index[0] == by_index[2]  # the same bits wherever a document sits


def test_ties_are_broken_by_index():
    # Hand-written scores: the response order, not the model, is under test here.
    req = RerankInput("q", ["a", "b", "c", "d"], "", None, False, None, None)
    out = build_response(req, [0.5, 0.9, 0.5, 0.1], 10, 0, "2", "m")
    assert [r["index"] for r in out["results"]] == [1, 0, 2, 3]


def test_instruction_override_changes_the_prompt(client):
    default = _rerank(client, query=QUERY, documents=DOCS[:2])["results"]
    other = _rerank(client, query=QUERY, documents=DOCS[:2],
                    instruction="Answer yes only if the document is about fruit {query}.")
    scores = lambda rs: {r["index"]: r["relevance_score"] for r in rs}  # noqa: E731
    assert scores(default) != scores(other["results"])


def test_max_tokens_per_doc_truncates_and_counts(client):
    # " apple" is one token, so the first 8 tokens of the long document are 8 words of it.
    long_doc = " ".join(["apple"] * 60)
    out = _rerank(client, query=QUERY, documents=[long_doc, "Paris."], max_tokens_per_doc=8)
    assert out["meta"]["truncated_documents"] == 1
    assert "truncated" in out["meta"]["warnings"][0]
    short = _rerank(client, query=QUERY, documents=[" ".join(["apple"] * 8), "Paris."])
    assert short["meta"]["truncated_documents"] == 0
    assert out["usage"]["total_tokens"] == short["usage"]["total_tokens"]
    scores = {r["index"]: r["relevance_score"] for r in out["results"]}
    ref = {r["index"]: r["relevance_score"] for r in short["results"]}
    assert all(scores[i] == ref[i] for i in (0, 1))


def test_max_tokens_per_doc_cuts_a_document_over_the_window_to_one_short_item(client):
    # Over max_seq_tokens 4096, this document would be scored in chunks
    # (tests/cpu/test_rerank_chunks.py); cut to 4 tokens it is one item.
    huge = " ".join(["apple"] * 5000)
    ok = _rerank(client, query=QUERY, documents=["short", huge], max_tokens_per_doc=4)
    assert ok["meta"]["truncated_documents"] == 1


@pytest.mark.parametrize("body, status, param", [
    ({"documents": ["a"]}, 400, "query"),
    ({"query": "q"}, 400, "documents"),
    ({"query": 5, "documents": ["a"]}, 400, "query"),
    ({"query": "q", "documents": "a"}, 400, "documents"),
    ({"query": "q", "documents": ["a", 5]}, 400, "documents[1]"),
    ({"query": "q", "documents": ["a", {"txt": "b"}]}, 400, "documents[1]"),
    ({"query": "q", "documents": ["a", None]}, 400, "documents[1]"),
    ('{"query": "q", "documents": ["\\ud800"]}', 400, "documents[0]"),  # raw JSON text
    ({"query": "q", "documents": ["a"], "top_n": 0}, 400, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": "2"}, 400, "top_n"),
    ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 0}, 400, "max_tokens_per_doc"),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, 400, "return_documents"),
    ({"query": "q", "documents": ["a"], "instruction": 3}, 400, "instruction"),
    ({"query": "q", "documents": ["a"], "rank_fields": ["x"]}, 400, "rank_fields"),
    ({"query": "q", "documents": [""] * 10_001}, 413, "documents"),
])
@pytest.mark.parametrize("route", ["/v1/rerank", "/v2/rerank"])
def test_bad_inputs_are_4xx_naming_the_field(client, route, body, status, param):
    if isinstance(body, str):
        r = client.post(route, content=body.encode(), headers={"content-type": "application/json"})
    else:
        r = client.post(route, json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_not_json_is_a_400(client):
    r = client.post("/v2/rerank", content=b"{not json",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"


def test_openapi_shows_both_routes_with_an_example(client):
    paths = client.get("/openapi.json").json()["paths"]
    for route in ("/v1/rerank", "/v2/rerank"):
        body = paths[route]["post"]["requestBody"]["content"]["application/json"]
        assert set(body["example"]) >= {"query", "documents"}
        assert "max_tokens_per_doc" in str(body["schema"])
    assert RerankRequest.model_json_schema()["properties"]["documents"]


# Five queries, each with exactly one clearly relevant passage among the five passages.
LABELLED = [
    ("What is the capital of France?", "Paris is the capital and most populous city of France."),
    ("How many legs does a spider have?", "Spiders have eight legs attached to the cephalothorax."),
    ("Who wrote Romeo and Juliet?",
     "Romeo and Juliet is a tragedy written by William Shakespeare."),
    ("What is the boiling point of water?", "At sea level, water boils at 100 degrees Celsius."),
    ("What do bees make?", "Honey bees produce honey from the nectar of flowers."),
]


def test_labelled_relevant_passages_rank_first(co_v2):
    """The 135M default model (4-bit quantized at source) is a weak judge: measured, it ranks
    the relevant passage first for 4 of these 5 queries (it misses one). The assertion is that
    measured hit rate, not a perfect ranking."""
    passages = [p for _, p in LABELLED]
    hits = 0
    for k, (query, _) in enumerate(LABELLED):
        out = co_v2.rerank(model="m", query=query, documents=passages)
        hits += out.results[0].index == k
    assert hits >= 4, f"relevant passage first for {hits}/5 queries"


def test_langchain_cohere_rerank_compresses_documents(server_url, api_keys):
    langchain_cohere = pytest.importorskip("langchain_cohere")
    from langchain_core.documents import Document

    reranker = langchain_cohere.CohereRerank(base_url=server_url,
                                             cohere_api_key=api_keys["team-a"],
                                             model="smollm2-135m-instruct", top_n=2)
    docs = [Document(page_content=d, metadata={"k": k}) for k, d in enumerate(DOCS)]
    out = reranker.compress_documents(docs, QUERY)
    assert len(out) == 2
    scores = [d.metadata["relevance_score"] for d in out]
    assert scores == sorted(scores, reverse=True)
    assert {d.metadata["k"] for d in out} < {0, 1, 2}
    assert all(d.page_content == DOCS[d.metadata["k"]] for d in out)


# ---- near-valid bodies: whatever the mix, the answer is a 200 or an enveloped 4xx -----------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_TEXT = st.text(max_size=12)
_ANY = st.one_of(st.none(), st.booleans(), st.integers(-3, 5), _TEXT, st.lists(_TEXT, max_size=2))
_DOC = st.one_of(_TEXT, st.fixed_dictionaries({"text": _TEXT}), _ANY)
_BODY = st.fixed_dictionaries({}, optional={
    "query": st.one_of(_TEXT, _ANY), "documents": st.one_of(st.lists(_DOC, max_size=3), _ANY),
    "top_n": _ANY, "return_documents": _ANY, "max_tokens_per_doc": _ANY,
    "instruction": st.one_of(_TEXT, _ANY), "model": st.one_of(_TEXT, _ANY)})


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_BODY, route=st.sampled_from(["/v1/rerank", "/v2/rerank"]))
def test_near_valid_bodies_never_give_a_5xx(client, body, route):
    r = client.post(route, json=body)
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        error = r.json()["error"]
        assert error["code"] == r.status_code and error["param"]
        return
    out = r.json()
    n = len(body["documents"])
    expected = n if body.get("top_n") is None else min(n, body["top_n"])
    assert len(out["results"]) == expected
    assert all(0.0 <= res["relevance_score"] <= 1.0 for res in out["results"])
