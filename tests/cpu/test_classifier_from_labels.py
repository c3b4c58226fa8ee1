"""rerank.classifier_from_labels: a causal reranker served as a one-class classifier whose head
is its LM head's yes row minus its no row (gpu_worker/model/heads.py::classifier_from_label_rows).

On the default SmolLM2 (fp32, CPU, yes_no template), the converted engine's sigmoid(score) must
equal the relevance HF's causal LM gives on each document's full prompt, P(yes) / (P(yes) +
P(no)), and today's engine's; over HTTP (`serve run` with the setting on) both rerank routes
answer that relevance and /v1/score answers as for a one-class classifier."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

import tools.service as tooling
from gpu_worker.forward.engine import Engine
from gpu_worker.model.heads import SequenceClassifierForScoring, rerank_label_ids
from gpu_worker.model.loader import load_model
from ranker_contract.config import EngineConfig, Limits, RerankConfig, RerankPrompt
from ranker_contract.model_config import ModelFolderError
from ranker_contract.packing import pack_multi_item
from serve_app.protocol import RerankRequest
from serve_app.rerank import RerankPrompter, check_rerank, relevance
from serve_app.tokenizer import TextTokenizer

TOL = 1e-5
QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital and most populous city of France.",
        "Bananas are rich in potassium.", "",
        "The Eiffel Tower, built in 1889, is in Paris."]
PROMPT = RerankConfig().resolved_prompt()  # yes_no: labels "yes" / "no"


def _full_prompt(document: str) -> str:
    prefix = (PROMPT.prefix.replace("{instruction}", PROMPT.default_instruction)
              .replace("{query}", QUERY))
    return prefix + PROMPT.document.replace("{document}", document) + PROMPT.suffix


def _hf_relevance(hf, tok, yes_no: tuple[int, int], document: str) -> float:
    ids = tok(_full_prompt(document))["input_ids"]
    with torch.inference_mode():
        logits = hf(torch.tensor([ids]), use_cache=False, logits_to_keep=1).logits[0, -1]
    lp = torch.log_softmax(logits.float(), dim=-1)
    p_yes, p_no = math.exp(lp[yes_no[0]]), math.exp(lp[yes_no[1]])
    return p_yes / (p_yes + p_no)


@pytest.fixture(scope="module")
def converted(default_model_path):
    yes_no = rerank_label_ids(default_model_path, PROMPT)
    return yes_no, Engine.from_config(default_model_path, EngineConfig(), yes_no)


def test_the_label_rows_become_a_one_class_head(converted, default_model_path):
    (yes, no), engine = converted
    model = engine.model
    assert isinstance(model, SequenceClassifierForScoring) and not hasattr(model, "lm_head")
    assert model.config.num_labels == 1
    from safetensors.torch import load_file

    embed = load_file(default_model_path / "model.safetensors")["model.embed_tokens.weight"]
    assert torch.equal(model.score.weight[0], embed[yes].float() - embed[no].float())  # tied


def test_sigmoid_of_the_score_is_hfs_and_todays_relevance(converted, default_model_path,
                                                        engine_for, hf_model_for):
    from transformers import AutoTokenizer

    yes_no, engine = converted
    prompter = RerankPrompter(PROMPT, TextTokenizer(default_model_path))
    assert tuple(prompter.label_ids) == yes_no  # the ingress resolves the same tokens
    req = check_rerank(RerankRequest(query=QUERY, documents=DOCS), Limits(),
                       PROMPT.default_instruction)
    tokens = prompter.tokenize(req)
    prefix, items = tokens.prefix, tokens.items
    seq = [pack_multi_item(prefix, items, 0)]
    (scores,) = engine.finish(engine.launch(seq, [[0]]))
    causal = engine_for(default_model_path)
    (logprobs,) = causal.finish(causal.launch(seq, [list(yes_no)]))
    tok = AutoTokenizer.from_pretrained(default_model_path, local_files_only=True)
    hf = hf_model_for(default_model_path)
    for k, doc in enumerate(DOCS):
        got = 1 / (1 + math.exp(-scores[k][0]))
        assert abs(got - relevance(logprobs[k])) <= TOL, f"document {k} vs today's"
        assert abs(got - _hf_relevance(hf, tok, yes_no, doc)) <= 1e-4, f"document {k} vs HF"


def test_a_classifier_folder_is_refused(tiny_classifier):
    with pytest.raises(ModelFolderError, match="classifier_from_labels"):
        load_model(tiny_classifier("qwen3_1class"), torch.float32, torch.device("cpu"),
                   head_from_labels=(1, 2))


def test_labels_must_be_one_token_each(default_model_path):
    prompt = PROMPT.model_copy(update={"yes_label": "yes indeed"})
    with pytest.raises(ValueError, match="yes_label 'yes indeed' is 2 tokens"):
        rerank_label_ids(default_model_path, prompt)


def test_the_ingress_and_the_scorer_resolve_the_same_label_ids(default_model_path):
    from serve_app.rerank import RerankPrompter
    from serve_app.tokenizer import TextTokenizer

    prompter = RerankPrompter(PROMPT, TextTokenizer(default_model_path))
    assert prompter.label_ids == list(rerank_label_ids(default_model_path, PROMPT))
    with pytest.raises(ValueError, match="yes_label 'yes indeed' is 2 tokens"):
        RerankPrompter(PROMPT.model_copy(update={"yes_label": "yes indeed"}),
                       TextTokenizer(default_model_path))


def test_the_setting_needs_a_template_with_labels():
    custom = RerankPrompt(prefix="{query}", suffix="")
    with pytest.raises(ValueError, match="classifier_from_labels needs"):
        RerankConfig(template="custom", prompt=custom, classifier_from_labels=True)


@pytest.fixture(scope="module")
def service_url(default_model_path):
    config = tooling.small_model_config(default_model_path)
    config["applications"][0]["args"]["rerank"] = {"template": "yes_no",
                                                   "classifier_from_labels": True}
    with tooling.serving(config) as service:
        yield service.url


@pytest.mark.service
def test_over_http(service_url, default_model_path, hf_model_for):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_path, local_files_only=True)
    yes_no = rerank_label_ids(default_model_path, PROMPT)
    hf = hf_model_for(default_model_path)
    with httpx.Client(base_url=service_url, timeout=120) as client:
        for route in ("/v1/rerank", "/v2/rerank"):
            r = client.post(route, json={"query": QUERY, "documents": DOCS})
            assert r.status_code == 200, r.text
            for result in r.json()["results"]:
                ref = _hf_relevance(hf, tok, yes_no, DOCS[result["index"]])
                assert abs(result["relevance_score"] - ref) <= 1e-4, (route, result)
        # /v1/score: a one-class classifier now; a vocabulary id is not a class
        r = client.post("/v1/score", json={"query": "q", "items": ["a"], "apply_sigmoid": True})
        assert r.status_code == 200 and len(r.json()["scores"][0]) == 1, r.text
        r = client.post("/v1/score", json={"query": "q", "items": ["a"],
                                           "label_token_ids": list(yes_no)})
        assert r.status_code == 400 and r.json()["error"]["param"] == "label_token_ids[0]"
