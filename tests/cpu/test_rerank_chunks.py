"""Long documents on /v1/rerank and /v2/rerank over real HTTP: a document longer than the window
is scored in chunks and gets its best chunk's score (docs/API.md, "Long documents").

The service is configs/score.yaml on the small random model (tools/random_model.py), whose
window is max_seq_tokens = 1024, so a few pages already make several chunks. The expected
scores come another way: the chunks are cut here from the tokenizer's own ids of the template's
parts, and each is scored as an item of /v1/score (multi-item scoring: each item sees only the
query); a document's relevance is its best chunk's P(yes) / (P(yes) + P(no)).
"""

from __future__ import annotations

import json
import os

import cohere
import httpx
import pytest
from transformers import AutoTokenizer

from ranker_contract.config import YES_NO_PROMPT
from tools.service import serving, small_model_config

pytestmark = pytest.mark.service

WINDOW = 1024  # small_model_config's max_seq_tokens; the model's context is longer
QUERY = "Which page is about rivers?"
WORDS = "river stone valley mountain city paper engine garden window music".split()


def _page(seed: int, words: int = 500) -> str:
    return " ".join(WORDS[(seed * 7 + i * i) % len(WORDS)] for i in range(words))


TEN_PAGES = " ".join(_page(p) for p in range(10))  # about 5,000 words
DOCS = [TEN_PAGES, "A short note about rivers.", " ".join(_page(p) for p in range(3, 6))]


@pytest.fixture(scope="module")
def service(small_model):
    config = small_model_config(small_model)
    # Cohere's per-request limits, as the shipped configs have them: 10,000 documents.
    config["applications"][0]["args"]["limits"].update(max_tokens_per_request=1 << 20,
                                                       max_items_per_request=10_000)
    # 10,000 documents are tens of seconds of this CPU scorer's work, past the shipped 60 s
    # proxy timeout on a busy 2-core machine (CI): the test is about the answer, not its speed.
    config["http_options"]["request_timeout_s"] = 600
    with serving(config) as running:
        yield running


@pytest.fixture(scope="module")
def http(service):
    with httpx.Client(base_url=service.url, timeout=600) as c:
        yield c


@pytest.fixture(scope="module")
def tok(small_model):
    return AutoTokenizer.from_pretrained(small_model)


class Chunker:
    """The prompt's parts as the tokenizer cuts them, and the chunks of a document."""

    def __init__(self, tok, query: str = QUERY) -> None:
        prefix = YES_NO_PROMPT.prefix.format(
            query=query, instruction=YES_NO_PROMPT.default_instruction)
        assert prefix.endswith(" ")  # the space starts each document (BPE joins it to a word)
        self.prefix = tok(prefix[:-1], add_special_tokens=True)["input_ids"]
        self.suffix = tok(YES_NO_PROMPT.suffix, add_special_tokens=False)["input_ids"]
        self.tok = tok
        self.room = WINDOW - len(self.prefix) - len(self.suffix)
        self.labels = [tok.convert_tokens_to_ids(t) for t in ("yes", "no")]

    def doc(self, text: str) -> list[int]:
        return self.tok(" " + text, add_special_tokens=False)["input_ids"]

    def chunks(self, text: str) -> list[list[int]]:
        ids = self.doc(text)
        return [ids[i:i + self.room] for i in range(0, len(ids), self.room)]


def chunk_relevance(http, chunker: Chunker, chunks: list[list[int]]) -> list[float]:
    """Each chunk's relevance, scored alone as an item of /v1/score."""
    r = http.post("/v1/score", json={"query": chunker.prefix, "apply_softmax": True,
                                     "items": [c + chunker.suffix for c in chunks],
                                     "label_token_ids": chunker.labels})
    assert r.status_code == 200, r.text
    return [yes for yes, _ in r.json()["scores"]]


def by_index(results) -> dict[int, float]:
    return {(r["index"] if isinstance(r, dict) else r.index):
            (r["relevance_score"] if isinstance(r, dict) else r.relevance_score)
            for r in results}


@pytest.fixture(scope="module")
def expected(http, tok):
    """Per document: each chunk's relevance, scored alone."""
    chunker = Chunker(tok)
    return [chunk_relevance(http, chunker, chunker.chunks(d)) for d in DOCS]


def test_the_long_documents_make_several_chunks(tok, expected):
    assert [len(e) for e in expected][0] >= 5 and len(expected[1]) == 1 and len(expected[2]) >= 2


def test_cohere_v2_and_v1_clients_get_each_documents_best_chunk(service, expected):
    for client in (cohere.ClientV2(base_url=service.url, api_key="k", timeout=120),
                   cohere.Client(base_url=service.url, api_key="k", timeout=120)):
        out = client.rerank(model="small-random", query=QUERY, documents=DOCS)
        scores = by_index(out.results)
        for k, chunks in enumerate(expected):
            assert scores[k] == pytest.approx(max(chunks), abs=1e-5)


def test_the_response_names_the_winning_chunk_and_counts_every_chunks_tokens(http, tok,
                                                                              expected):
    out = http.post("/v2/rerank", json={"query": QUERY, "documents": DOCS}).json()
    won = {r["index"]: r.get("best_chunk") for r in out["results"]}
    assert won[1] is None  # one chunk: nothing to name
    for k in (0, 2):
        assert won[k] == expected[k].index(max(expected[k]))
    chunker = Chunker(tok)
    items = sum(len(chunker.chunks(d)) for d in DOCS)
    document_tokens = sum(len(chunker.doc(d)) for d in DOCS)
    # every chunk's tokens and suffix, a prefix per packed sequence (at least one), a delimiter
    # per item: at least this many
    least = document_tokens + items * len(chunker.suffix) + len(chunker.prefix)
    assert out["usage"]["total_tokens"] >= least
    assert out["meta"]["tokens"]["input_tokens"] == out["usage"]["total_tokens"]


def test_return_chunks_names_the_best_chunk_and_the_text_it_scored(http, tok, expected):
    """The chunk's index is the best of the chunks scored alone, and its characters spell that
    chunk's tokens; a document of one chunk spans all of its text."""
    chunker = Chunker(tok)
    out = http.post("/v2/rerank", json={"query": QUERY, "documents": DOCS,
                                        "return_chunks": True}).json()
    for result in out["results"]:
        k, chunk = result["index"], result["chunk"]
        assert chunk["index"] == expected[k].index(max(expected[k]))
        ids = chunker.chunks(DOCS[k])[chunk["index"]]
        assert DOCS[k][chunk["start"]:chunk["end"]] == tok.decode(ids).lstrip(" ")
    assert out["results"][[r["index"] for r in out["results"]].index(1)]["chunk"] == {
        "index": 0, "start": 0, "end": len(DOCS[1])}


@pytest.mark.parametrize(("aggregation", "top_k", "of"), [
    ("mean", None, lambda chunks: sum(chunks) / len(chunks)),
    ("top_k_mean", 2, lambda chunks: sum(sorted(chunks)[-2:]) / len(sorted(chunks)[-2:])),
    ("top_k_mean", None, lambda chunks: sum(sorted(chunks)[-3:]) / len(sorted(chunks)[-3:])),
])
def test_chunk_aggregation_over_the_chunks_lone_scores(http, expected, aggregation, top_k, of):
    body = {"query": QUERY, "documents": DOCS, "chunk_aggregation": aggregation}
    if top_k is not None:
        body["chunk_top_k"] = top_k
    r = http.post("/v1/rerank", json=body)
    assert r.status_code == 200, r.text
    scores = by_index(r.json()["results"])
    for k, chunks in enumerate(expected):
        assert scores[k] == pytest.approx(of(chunks), abs=1e-5)


def test_litellm_rerank_gets_the_same_scores(service, expected):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import
    import litellm

    out = litellm.rerank(model="cohere/small-random", query=QUERY, documents=DOCS,
                         api_base=service.url, api_key="k", num_retries=0)
    scores = by_index(out.results)
    for k, chunks in enumerate(expected):
        assert scores[k] == pytest.approx(max(chunks), abs=1e-5)


def test_max_chunks_per_doc_scores_only_the_first_chunks_and_warns(http, expected):
    out = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCS,
                                        "max_chunks_per_doc": 2}).json()
    scores = by_index(out["results"])
    for k, chunks in enumerate(expected):
        assert scores[k] == pytest.approx(max(chunks[:2]), abs=1e-5)
    assert any("max_chunks_per_doc=2" in w for w in out["meta"]["warnings"])


def test_max_tokens_per_doc_truncates_before_chunking(http, tok):
    chunker = Chunker(tok)
    head = chunker.doc(TEN_PAGES)[:chunker.room + 100]  # two chunks after truncation
    want = chunk_relevance(http, chunker, [head[:chunker.room], head[chunker.room:]])
    out = http.post("/v2/rerank", json={"query": QUERY, "documents": [TEN_PAGES],
                                        "max_tokens_per_doc": chunker.room + 100}).json()
    assert out["results"][0]["relevance_score"] == pytest.approx(max(want), abs=1e-5)
    assert out["meta"]["truncated_documents"] == 1


@pytest.mark.parametrize("direction", ["Right", "left"])
def test_truncate_keeps_one_window_of_the_start_or_the_end(http, tok, direction):
    chunker = Chunker(tok)
    ids = chunker.doc(TEN_PAGES)
    kept = ids[:chunker.room] if direction.lower() == "right" else ids[-chunker.room:]
    want = chunk_relevance(http, chunker, [kept])[0]
    out = http.post("/v2/rerank", json={"query": QUERY, "documents": [TEN_PAGES],
                                        "truncate": True,
                                        "truncation_direction": direction}).json()
    result = out["results"][0]
    assert result["relevance_score"] == pytest.approx(want, abs=1e-5)
    assert "best_chunk" not in result and out["meta"]["truncated_documents"] == 1


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"documents": ["d"] * 1001, "max_chunks_per_doc": 10}, 400, "max_chunks_per_doc"),
    ({"documents": ["d"], "query": "word " * 2100}, 400, "query"),
    ({"documents": ["d"] * 10_001}, 413, "documents"),
    ({"documents": ["d"], "truncation_direction": "middle"}, 400, "truncation_direction"),
    ({"documents": ["d"], "max_chunks_per_doc": 0}, 400, "max_chunks_per_doc"),
])
def test_cohere_limits_are_4xx_naming_the_field(http, body, status, field):
    r = http.post("/v1/rerank", content=json.dumps({"query": QUERY} | body))
    assert r.status_code == status, r.text
    assert field in r.text


def test_ten_thousand_short_documents_answer(http):
    docs = [f"note {k} about rivers" for k in range(10_000)]
    r = http.post("/v2/rerank", json={"query": QUERY, "documents": docs, "top_n": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["results"]) == 3 and out["meta"]["billed_units"]["search_units"] == 100
    assert len({res["index"] for res in out["results"]}) == 3
