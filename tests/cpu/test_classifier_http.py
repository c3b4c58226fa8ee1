"""Classification models over real HTTP (`serve run` of configs/score.yaml pointed at a tiny
seeded *ForSequenceClassification folder written by transformers, with a real tokenizer):
/v1/score's class logits and /v1|v2/rerank's relevance against HF
`AutoModelForSequenceClassification` on each query + item alone, and the 400s of a request that
does not fit a classifier. Two services, one after the other: a one-class Qwen3 (a reward
model's head) with the Qwen3 tokenizer and the qwen3 rerank template, and a two-class Llama with
the default model's tokenizer and the yes_no template. Each serves two LoRA adapters too, one
with a classification head of its own."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

import tools.service as tooling
from tests.support.adapters import write_classifier_adapter
from tests.support.classifiers import hf_logits, reference_relevance
from tools.random_model import default_model_tokenizer, qwen3_tokenizer

pytestmark = pytest.mark.service  # starts Ray (the slow tier)

TOL = 1e-4
# name -> (tiny_classifier key, vocabulary, tokenizer files, rerank template)
SERVED = {
    "qwen3_1class": ("qwen3_1class", 151936, qwen3_tokenizer, "qwen3"),
    "llama_2class": ("llama_2class", 49152, default_model_tokenizer, "yes_no"),
}
QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital and most populous city of France.",
        "Bananas are rich in potassium.", ""]


@pytest.fixture(scope="module", params=list(SERVED))
def svc(request, tiny_classifier, tmp_path_factory):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    name, vocab, tokenizer_files, template = SERVED[request.param]
    path = tiny_classifier(name, vocab, tokenizer_files())
    config = tooling.small_model_config(path)
    config["applications"][0]["args"]["rerank"] = {"template": template}
    adapters = tmp_path_factory.mktemp("adapters")  # LoRA adapters, one with a head of its own
    merged = {adapter: write_classifier_adapter(path, adapters / adapter, own_head, seed=40 + k)
              for k, (adapter, own_head) in enumerate((("own-head", True), ("no-head", False)))}
    config["applications"][0]["args"]["adapters"] = [
        {"name": adapter, "path": str(adapters / adapter)} for adapter in merged]
    with tooling.serving(config) as service, \
            httpx.Client(base_url=service.url, timeout=120) as client:
        hf = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
        yield dict(client=client, hf=hf, classes=hf.config.num_labels, template=template,
                   tokenizer=AutoTokenizer.from_pretrained(path, local_files_only=True),
                   merged=merged)


def _post(client, route, body, status=200):
    r = client.post(route, json=body)
    assert r.status_code == status, r.text
    return r.json()


def test_score_returns_each_items_class_logits_as_hf_on_query_plus_item(svc):
    query, items = [1000 + i for i in range(25)], [[3000 + i for i in range(n)] for n in (7, 0, 2)]
    out = _post(svc["client"], "/v1/score", {"query": query, "items": items})
    assert len(out["scores"]) == len(items)
    for k, (row, item) in enumerate(zip(out["scores"], items)):
        ref = hf_logits(svc["hf"], query + item)
        assert len(row) == svc["classes"]
        assert max(abs(a - b) for a, b in zip(row, ref)) <= TOL, f"item {k}"
    for k, item in enumerate(items):  # multi-item == one item at a time
        alone = _post(svc["client"], "/v1/score", {"query": query, "items": [item]})
        assert alone["scores"][0] == pytest.approx(out["scores"][k], abs=1e-5)


def test_an_adapter_with_its_own_head_scores_as_hf_on_its_merged_model(svc):
    """Requests naming an adapter: one that brings its own trained head (modules_to_save) and
    one that does not each score as HF on peft's merge_and_unload() of it."""
    query, items = [1000 + i for i in range(25)], [[3000 + i for i in range(n)] for n in (7, 2)]
    for adapter, merged in svc["merged"].items():
        out = _post(svc["client"], "/v1/score", {"query": query, "items": items,
                                                 "model": adapter})
        for k, (row, item) in enumerate(zip(out["scores"], items, strict=True)):
            ref = hf_logits(merged, query + item)
            assert max(abs(a - b) for a, b in zip(row, ref, strict=True)) <= TOL, (adapter, k)
    base = _post(svc["client"], "/v1/score", {"query": query, "items": items})["scores"]
    own = _post(svc["client"], "/v1/score", {"query": query, "items": items,
                                             "model": "own-head"})["scores"]
    assert max(abs(a - b) for a, b in zip(base[0], own[0])) > 10 * TOL  # the adapter counts


def test_score_sigmoid_softmax_and_class_order(svc):
    client, hf = svc["client"], svc["hf"]
    ids = svc["tokenizer"]("Is the sky blue?")["input_ids"]
    item = svc["tokenizer"](" Yes, it is.", add_special_tokens=False)["input_ids"]
    ref = hf_logits(hf, ids + item)
    body = {"query": "Is the sky blue?", "items": [" Yes, it is."]}
    raw = _post(client, "/v1/score", body)["scores"][0]
    assert raw == pytest.approx(ref, abs=TOL)  # text tokenized as transformers does
    sig = _post(client, "/v1/score", {**body, "apply_sigmoid": True})["scores"][0]
    assert sig == pytest.approx([1 / (1 + math.exp(-x)) for x in ref], abs=TOL)
    if svc["classes"] == 1:
        err = _post(client, "/v1/score", {**body, "apply_softmax": True}, 400)["error"]
        assert err["param"] == "apply_softmax"
        return
    soft = _post(client, "/v1/score", {**body, "apply_softmax": True})["scores"][0]
    expected = torch.softmax(torch.tensor(ref), dim=-1).tolist()
    assert soft == pytest.approx(expected, abs=TOL)
    reversed_ = _post(client, "/v1/score", {**body, "label_token_ids": [1, 0]})["scores"][0]
    assert reversed_ == pytest.approx(ref[::-1], abs=TOL)


@pytest.mark.parametrize(("body", "param"), [
    ({"label_token_ids": [5]}, "label_token_ids[0]"),  # a token id, not a class index
    ({"apply_sigmoid": True, "apply_softmax": True}, "apply_sigmoid"),
    ({"apply_sigmoid": 1}, "apply_sigmoid"),
])
def test_requests_that_do_not_fit_a_classifier_are_400s_naming_the_field(svc, body, param):
    out = _post(svc["client"], "/v1/score", {"query": "q", "items": ["a"], **body}, 400)
    assert out["error"]["param"] == param


@pytest.mark.parametrize("route", ["/v1/rerank", "/v2/rerank"])
def test_rerank_relevance_is_the_heads_probability_on_each_full_prompt(svc, route):
    out = _post(svc["client"], route, {"query": QUERY, "documents": DOCS})
    results = out["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    for r in results:
        ref = reference_relevance(svc["hf"], svc["tokenizer"], svc["template"], QUERY,
                                  DOCS[r["index"]])
        assert math.isclose(r["relevance_score"], ref, abs_tol=TOL), f"document {r['index']}"
