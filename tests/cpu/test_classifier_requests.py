"""What /v1/score and /v1|v2/rerank mean on a classification model (serve_app/classifier.py),
in the ingress's own steps: parsing and checks (every refusal a 400 naming the field), and
class logits to scores and relevances. Expected values are written out by hand."""

from __future__ import annotations

import math

import pytest

from ranker_contract.config import Limits, RerankConfig, RerankPrompt
from serve_app.protocol import ApiError
from serve_app.rerank import RerankPrompter
from serve_app.routes import RerankRoute, ScoreRoute, Tokenized
from serve_app.tokenizer import TextTokenizer

LN3 = math.log(3.0)  # softmax([0, ln 3]) = [1/4, 3/4]; sigmoid(ln 3) = 3/4


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    return TextTokenizer(default_model_path)


def _score_route(tokenizer, num_labels):
    return ScoreRoute(Limits(), 49152, tokenizer, "m", num_labels)


def _parse(route, **body):
    return route.parse({"query": [1, 2], "items": [[3]], **body})


def _refusal(route, **body) -> ApiError:
    with pytest.raises(ApiError) as exc:
        _parse(route, **body)
    assert exc.value.status == 400
    return exc.value


def test_label_token_ids_default_to_every_class_in_order(tokenizer):
    assert _parse(_score_route(tokenizer, 3)).label_ids == [0, 1, 2]
    assert _parse(_score_route(tokenizer, 1)).label_ids == [0]
    assert _parse(_score_route(tokenizer, 3), label_token_ids=[2, 0]).label_ids == [2, 0]


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"label_token_ids": [0, 3]}, "label_token_ids[1]", "class indices in [0, 3)"),
    ({"label_token_ids": [-1]}, "label_token_ids[0]", "class indices"),
    ({"label_token_ids": []}, "label_token_ids", "left out for every class"),
    ({"label_token_ids": [1, 1]}, "label_token_ids", "duplicates"),
    ({"apply_softmax": True, "apply_sigmoid": True}, "apply_sigmoid", "choose one"),
])
def test_bad_class_requests_are_400s_naming_the_field(tokenizer, body, param, words):
    err = _refusal(_score_route(tokenizer, 3), **body)
    assert err.param == param and words in err.message


def test_softmax_over_one_class_is_refused_pointing_at_sigmoid(tokenizer):
    err = _refusal(_score_route(tokenizer, 1), apply_softmax=True)
    assert err.param == "apply_softmax" and "apply_sigmoid" in err.message


@pytest.mark.parametrize("value", [True, False])
def test_apply_sigmoid_on_a_causal_lm_is_a_400_naming_it(tokenizer, value):
    err = _refusal(_score_route(tokenizer, None), label_token_ids=[5], apply_sigmoid=value)
    assert err.param == "apply_sigmoid" and "classification models only" in err.message


def test_a_causal_lm_still_requires_vocabulary_labels(tokenizer):
    assert _refusal(_score_route(tokenizer, None)).param == "label_token_ids"
    assert _refusal(_score_route(tokenizer, None),
                    label_token_ids=[49152]).param == "label_token_ids[0]"


def _scores(route, rows, **body):
    req = _parse(route, **body)
    return route.respond(req, Tokenized([], [], req.label_ids, False), rows, 7)["scores"]


@pytest.mark.parametrize(("body", "expected"), [
    ({}, [[0.0, LN3], [-2.5, 1000.0]]),  # raw logits
    ({"apply_softmax": True}, [[0.25, 0.75], [0.0, 1.0]]),
    ({"apply_sigmoid": True}, [[0.5, 0.75], [1 / (1 + math.exp(2.5)), 1.0]]),
])
def test_class_logits_to_scores(tokenizer, body, expected):
    got = _scores(_score_route(tokenizer, 2), [[0.0, LN3], [-2.5, 1000.0]], **body)
    assert len(got) == len(expected)
    for row, want in zip(got, expected):
        assert row == pytest.approx(want, abs=1e-12)


def test_sigmoid_of_a_large_negative_logit_does_not_overflow(tokenizer):
    assert _scores(_score_route(tokenizer, 1), [[-1000.0]], apply_sigmoid=True) == [[0.0]]


def _rerank_route(tokenizer, num_labels):
    prompter = RerankPrompter(RerankConfig().resolved_prompt(), tokenizer, label_tokens=False)
    return RerankRoute(prompter, "", Limits(), "m", "2", num_labels)


def _relevances(route, rows):
    req = route.parse({"query": "q", "documents": ["a"] * len(rows)})
    out = route.respond(req, Tokenized([], [], route.label_ids, True), rows, 7)
    return [r["relevance_score"] for r in sorted(out["results"], key=lambda r: r["index"])]


def test_rerank_relevance_is_the_sigmoid_of_one_class(tokenizer):
    route = _rerank_route(tokenizer, 1)
    assert route.label_ids == [0]
    assert _relevances(route, [[LN3], [0.0], [-LN3]]) == pytest.approx([0.75, 0.5, 0.25])


def test_rerank_relevance_of_two_classes_is_class_1s_probability(tokenizer):
    route = _rerank_route(tokenizer, 2)
    assert route.label_ids == [0, 1]
    assert _relevances(route, [[0.0, LN3], [LN3, 0.0]]) == pytest.approx([0.75, 0.25])


def test_rerank_on_more_than_two_classes_is_a_400_pointing_at_score(tokenizer):
    with pytest.raises(ApiError) as exc:
        _rerank_route(tokenizer, 3).parse({"query": "q", "documents": ["a"]})
    assert exc.value.status == 400 and "/v1/score" in exc.value.message


def test_a_classifier_template_may_leave_out_the_labels_a_causal_one_may_not(tokenizer):
    prompt = RerankPrompt(prefix="{query}\n", suffix="\n")
    assert RerankPrompter(prompt, tokenizer, label_tokens=False).label_ids is None
    with pytest.raises(ValueError, match="yes_label and no_label are required on a causal LM"):
        RerankPrompter(prompt, tokenizer)
    with pytest.raises(ValueError, match="set both"):
        RerankPrompt(prefix="{query}", suffix="", yes_label="yes")
