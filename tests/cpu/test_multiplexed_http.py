"""Full models beside the model (`models`, loaded through Ray Serve's model multiplexing) over
real HTTP: a `serve run` of the small model with three more, two tiny classifiers (each with its
own tokenizer, head and rerank template) and a copy of the small model, on two scorer replicas
that hold one of them each (`multiplex.max_models_per_replica: 1`), the first preloaded.

- a preloaded model is held by every scorer from the start: its first request loads nothing;
- each model scores as HF on its own weights; the copy as the model itself;
- the two classifiers, alternating, come to be held by a replica each (the router sends a model
  to a replica that holds it, else to one that holds fewer), and then load no more;
- a third model displaces one (Serve's least recently used), which loads again when named;
- requests of all four at once are all answered, each as when alone;
- the scorers' metrics count the items of every model.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

import tools.service as tooling
from tests.support.classifiers import hf_logits, reference_relevance
from tests.support.service import replica_processes
from tools.prom import scrape
from tools.random_model import default_model_tokenizer, qwen3_tokenizer

pytestmark = pytest.mark.service  # starts Ray (the slow tier)

TOL = 1e-4
# name -> (tiny_classifier key, vocabulary, tokenizer files, rerank template)
CLASSIFIERS = {
    "cls-qwen3": ("qwen3_1class", 151936, qwen3_tokenizer, "qwen3"),
    "cls-llama": ("llama_2class", 49152, default_model_tokenizer, "yes_no"),
}
MODELS = [*CLASSIFIERS, "small-copy"]  # the `models` of the service
QUERY, ITEMS = [1000 + i for i in range(25)], [[3000 + i for i in range(n)] for n in (7, 2)]
LABELS = [9, 11]  # tokens of the small model; classes are the classifiers' own
DOC = "Paris is the capital and most populous city of France."
# Serve's own metrics of multiplexed models (ray/serve/multiplex.py): loads, unloads and calls
# of the model getter (one per request of a model), and which replica holds which model.
LOADS = "ray_serve_multiplexed_models_load_counter_total"
UNLOADS = "ray_serve_multiplexed_models_unload_counter_total"
CALLS = "ray_serve_multiplexed_get_model_requests_counter_total"
HELD = "ray_serve_registered_multiplexed_model_id"
ITEMS_SCORED = "ray_ranker_items_scored_total"  # the scorers' own


def worst(a: list[list[float]], b: list[list[float]]) -> float:
    """The largest difference between two answers' scores."""
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True)
               for x, y in zip(ra, rb, strict=True))


def total(metrics_url: str, metric: str) -> float:
    return sum(value for name, _, value in scrape(metrics_url) if name == metric)


def held(metrics_url: str) -> dict[str, set[str]]:
    """Model -> the replicas holding it."""
    homes: dict[str, set[str]] = {}
    for name, labels, value in scrape(metrics_url):
        if name == HELD and value == 1:
            homes.setdefault(labels["model_id"], set()).add(labels["replica"])
    return homes


def test_full_models_load_on_their_own_replicas_and_score_as_hf(small_model, tiny_classifier):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    config = tooling.small_model_config(small_model)
    args = config["applications"][0]["args"]
    folders = {name: tiny_classifier(key, vocab, files())
               for name, (key, vocab, files, _) in CLASSIFIERS.items()}
    args["models"] = [*({"name": name, "path": str(folders[name]),
                         "rerank": {"template": CLASSIFIERS[name][3]}} for name in CLASSIFIERS),
                      {"name": "small-copy", "path": str(small_model)}]
    assert [m["name"] for m in args["models"]] == MODELS
    args["multiplex"] = {"max_models_per_replica": 1, "preload": ["cls-qwen3"]}
    worker = tooling.deployment(config, "ScoreWorker")
    worker.pop("autoscaling_config")
    worker.update(num_replicas=2)
    worker["ray_actor_options"]["num_cpus"] = 0.5
    hf = {name: AutoModelForSequenceClassification.from_pretrained(
        folder, dtype=torch.float32).eval() for name, folder in folders.items()}
    tokenizers = {name: AutoTokenizer.from_pretrained(folder, local_files_only=True)
                  for name, folder in folders.items()}
    with tooling.serving(config, tooling.FAST_METRICS_ENV) as svc, \
            httpx.Client(base_url=svc.url, timeout=120) as client:
        tooling.wait_until(lambda: len(replica_processes(svc, "ScoreWorker")) == 2, 240,
                           "two scorers", svc)
        metrics_url = svc.metrics_url()

        sent = []  # items of each answered request
        # what asked a replica's multiplexer for a model: each preload, each request naming one
        asked = ["cls-qwen3"] * 2

        def counted() -> None:
            """Until the replicas' metrics show every request so far (exported each second)."""
            tooling.wait_until(lambda: total(metrics_url, CALLS) == len(asked), 60,
                               f"{len(asked)} model requests counted", svc)

        def post(route: str, body: dict, status: int = 200) -> dict:
            r = client.post(route, json=body)
            assert r.status_code == status, r.text
            if status == 200:
                sent.append(len(body.get("items", body.get("documents", []))))
                if body.get("model") in MODELS:
                    asked.append(body["model"])
            return r.json()

        def score(model: str | None) -> list[list[float]]:
            body = {"query": QUERY, "items": ITEMS} | ({"model": model} if model else {})
            if model is None or model == "small-copy":
                body["label_token_ids"] = LABELS
            return post("/v1/score", body)["scores"]

        models = [m["id"] for m in client.get("/v1/models").json()["data"]]
        assert models == ["small-random", "cls-qwen3", "cls-llama", "small-copy"]
        unknown = post("/v1/score", {"query": "q", "items": ["a"], "model": "nobody"}, 404)
        assert unknown["error"]["param"] == "model"
        own = score(None)

        # Preloaded: held by both scorers from the start, so its first request loads nothing.
        tooling.wait_until(lambda: len(held(metrics_url).get("cls-qwen3", ())) == 2, 60,
                           "cls-qwen3 preloaded by both scorers", svc)
        score("cls-qwen3")
        counted()
        assert (total(metrics_url, LOADS), total(metrics_url, UNLOADS)) == (2, 0)

        # The classifiers alternate. Once a round of both loads nothing (a replica tells the
        # routers what it holds within a second: until then two may land on one), each is held
        # by a replica of its own and they stay: no more loads, nor unloads.
        answers = {}

        def settled() -> bool:
            counted()
            loads = total(metrics_url, LOADS)
            for name in CLASSIFIERS:
                answers[name] = score(name)
            counted()
            return total(metrics_url, LOADS) == loads

        tooling.wait_until(settled, 120, "a round of both classifiers that loads nothing", svc)

        def apart() -> bool:
            homes = held(metrics_url)
            return all(len(homes.get(name, ())) == 1 for name in CLASSIFIERS) and \
                len(set().union(*(homes[name] for name in CLASSIFIERS))) == 2

        tooling.wait_until(apart, 60, "each classifier held by a replica of its own", svc)
        loads, unloads = total(metrics_url, LOADS), total(metrics_url, UNLOADS)
        for _ in range(3):
            for name in CLASSIFIERS:
                answers[name] = score(name)
                for k, item in enumerate(ITEMS):
                    ref = hf_logits(hf[name], QUERY + item)
                    assert answers[name][k] == pytest.approx(ref, abs=TOL), (name, k)
        counted()
        assert (total(metrics_url, LOADS), total(metrics_url, UNLOADS)) == (loads, unloads)
        for name, (_, _, _, template) in CLASSIFIERS.items():  # its own template and head
            out = post("/v1/rerank", {"query": "What is the capital of France?",
                                      "documents": [DOC], "model": name})
            ref = reference_relevance(hf[name], tokenizers[name], template,
                                      "What is the capital of France?", DOC)
            assert math.isclose(out["results"][0]["relevance_score"], ref, abs_tol=TOL)

        # A third model displaces one of them, which loads again when named.
        assert worst(score("small-copy"), own) <= 1e-6  # the same weights
        for name in CLASSIFIERS:
            assert worst(score(name), answers[name]) <= 1e-6
        tooling.wait_until(lambda: total(metrics_url, UNLOADS) >= 1, 60, "an unload", svc)

        # All four at once, over and over: every request answered, as when alone.
        expected = {None: own, "small-copy": own, **answers}
        names = [*expected] * 6
        with ThreadPoolExecutor(len(names)) as pool:
            got = list(pool.map(score, names))
        for name, scores in zip(names, got, strict=True):
            assert worst(scores, expected[name]) <= 1e-6, name

        # The scorers' metrics count every model's items, not only model_path's.
        tooling.wait_until(lambda: total(metrics_url, ITEMS_SCORED) == sum(sent), 60,
                           f"{sum(sent)} items counted", svc)
