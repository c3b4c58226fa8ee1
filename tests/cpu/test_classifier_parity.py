"""Sequence classifiers (gpu_worker/model/heads.py) against HF `AutoModelForSequenceClassification`.

Tiny seeded Qwen3 (one class), Llama (three classes, a pad token) and Qwen2 (two classes)
folders written by transformers' save_pretrained are loaded by our loader and scored by our
fp32 CPU engine: each class logit at an item's score row must equal HF's pooled logits for
query + item alone within 1e-4, plain and multi-item; and a multi-item sequence must score each
item as that item packed alone does.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpu_worker.model.heads import SequenceClassifierForScoring
from gpu_worker.model.loader import load_model
from ranker_contract.model_config import ModelConfig, ModelFolderError
from ranker_contract.packing import pack_multi_item, pack_plain

TOL = 1e-4
CLASSIFIERS = ("qwen3_1class", "llama_3class", "qwen2_2class")
ITEM_LENS = (6, 0, 11, 1)  # an empty item scores at the query's last token, as HF on the query
QUERY_LEN = 30


@pytest.fixture(scope="module")
def hf_classifier_for():
    from transformers import AutoModelForSequenceClassification

    models: dict = {}

    def get(path):
        if path not in models:
            models[path] = AutoModelForSequenceClassification.from_pretrained(
                path, dtype=torch.float32).eval()
        return models[path]

    return get


@pytest.fixture(scope="module", params=CLASSIFIERS)
def case(request, tiny_classifier, engine_for, hf_classifier_for):
    path = tiny_classifier(request.param)
    engine, hf = engine_for(path), hf_classifier_for(path)
    rng = random.Random(f"classifier-{request.param}")
    # The Llama folder's pad token is the last id: HF would pool before it, so inputs avoid it.
    vocab = engine.vocab_size - 1

    def tokens(n):
        return [rng.randrange(vocab) for _ in range(n)]

    def reference(ids: list[int]) -> list[float]:
        with torch.inference_mode():
            return hf(torch.tensor([ids])).logits[0].float().tolist()

    return dict(engine=engine, hf=hf, classes=list(range(hf.config.num_labels)),
                query=tokens(QUERY_LEN), items=[tokens(n) for n in ITEM_LENS],
                delimiter=rng.randrange(vocab), reference=reference, path=path)


def _max_diff(ours, ref):
    return max(abs(a - b) for a, b in zip(ours, ref, strict=True))


def test_the_loader_builds_a_classifier_with_hf_classes(case):
    model = case["engine"].model
    assert isinstance(model, SequenceClassifierForScoring)
    assert not hasattr(model, "lm_head")  # nothing over the vocabulary
    cfg = ModelConfig.from_folder(case["path"])
    assert cfg.num_labels == case["hf"].config.num_labels == len(case["classes"])
    assert list(cfg.class_names) == [case["hf"].config.id2label[i] for i in case["classes"]]
    ref = load_file(case["path"] / "model.safetensors")["score.weight"]
    assert torch.equal(model.score.weight, ref)


def test_plain_sequences_match_hf(case, score_sequences):
    query, items = case["query"], case["items"]
    seqs = [pack_plain(query + item, k) for k, item in enumerate(items)]
    results = score_sequences(case["engine"], seqs, case["classes"])
    for k, (item, rows) in enumerate(zip(items, results, strict=True)):
        diff = _max_diff(rows[0], case["reference"](query + item))
        assert diff <= TOL, f"item {k}: max |Δ logit| = {diff:.2e}"


def test_multi_item_sequence_matches_hf(case, score_sequences):
    query, items = case["query"], case["items"]
    (rows,) = score_sequences(case["engine"],
                              [pack_multi_item(query, items, case["delimiter"])], case["classes"])
    assert len(rows) == len(items)
    for k, item in enumerate(items):
        diff = _max_diff(rows[k], case["reference"](query + item))
        assert diff <= TOL, f"item {k} (len {len(item)}): max |Δ logit| = {diff:.2e}"


def test_multi_item_equals_one_item_at_a_time(case, score_sequences):
    query, items, delim = case["query"], case["items"], case["delimiter"]
    (packed,) = score_sequences(case["engine"], [pack_multi_item(query, items, delim)],
                                case["classes"])
    for k, item in enumerate(items):
        (alone,) = score_sequences(case["engine"], [pack_multi_item(query, [item], delim)],
                                   case["classes"])
        assert _max_diff(packed[k], alone[0]) <= 1e-5, f"item {k}"


def test_a_batch_of_class_subsets_in_any_order(case):
    """Label ids are class indices: each sequence gets the classes it asked for, in its order."""
    query, items, delim = case["query"], case["items"], case["delimiter"]
    subsets = [list(reversed(case["classes"])), case["classes"][-1:]]
    engine = case["engine"]
    results = engine.finish(engine.launch(
        [pack_multi_item(query, items, delim), pack_plain(items[2] + query, 0)], subsets))
    for k, item in enumerate(items):
        ref = case["reference"](query + item)
        assert _max_diff(results[0][k], [ref[c] for c in subsets[0]]) <= TOL
    ref = case["reference"](items[2] + query)  # item_first: item + query as one sequence
    assert _max_diff(results[1][0], [ref[c] for c in subsets[1]]) <= TOL


def test_a_score_head_that_disagrees_with_id2label_is_refused(tiny_classifier, tmp_path):
    source = tiny_classifier("llama_3class")
    for name in ("config.json",):
        (tmp_path / name).write_text((source / name).read_text())
    state = load_file(source / "model.safetensors")
    state["score.weight"] = state["score.weight"][:2].contiguous()  # 2 rows, 3 names
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ModelFolderError, match=r"score.weight is \[2, 64\].*3 classes"):
        load_model(tmp_path, torch.float32, torch.device("cpu"))


def test_an_unknown_head_is_refused_naming_the_architecture(tiny_classifier, tmp_path):
    config = json.loads((tiny_classifier("qwen3_1class") / "config.json").read_text())
    config["architectures"] = ["Qwen3ForTokenClassification"]
    with pytest.raises(ModelFolderError, match="Qwen3ForTokenClassification"):
        ModelConfig.from_dict(config)


def test_a_prefix_cache_hit_scores_the_classes_as_hf(case):
    """The prefix cache (engine.prefix_cache.tokens) sits under the head: a hit, which runs only
    the item blocks against the cached query rows, gives HF's logits as the miss did."""
    from gpu_worker.forward.engine import Engine
    from ranker_contract.config import EngineConfig

    engine = Engine.from_config(case["path"], EngineConfig(prefix_cache={"tokens": 4096,
                                                                         "min_tokens": 8}))
    query, items, delim = case["query"], case["items"], case["delimiter"]
    # No empty item: one scores at the query's last row, which a hit does not compute.
    for attempt, chosen in (("miss", [items[0], items[2]]), ("hit", [items[3], items[0]])):
        (rows,) = engine.finish(engine.launch([pack_multi_item(query, chosen, delim)],
                                              [case["classes"]]))
        for k, item in enumerate(chosen):
            diff = _max_diff(rows[k], case["reference"](query + item))
            assert diff <= TOL, f"{attempt}, item {k}: max |Δ logit| = {diff:.2e}"
    assert (engine.prefix_cache.stats.misses, engine.prefix_cache.stats.hits) == (1, 1)
