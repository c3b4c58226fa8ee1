"""Adapters over two scorer replicas (a real `serve run`, small model, CPU, one adapter slot
each): the requests of an adapter reach one replica, its home (ranker_app/scorer_router.py),
which loads it once and keeps it; routed by load alone, they would spread and each replica
would load it. The scorers' metrics count the loads by model and replica."""

from __future__ import annotations

import httpx
import pytest

import tools.service as tooling
from tests.support.adapters import ALL, write_adapters
from tests.support.service import replica_processes
from tools.prom import scrape

pytestmark = pytest.mark.service  # starts Ray (the slow tier)

ADAPTERS = {name: dict(r=4, lora_alpha=8, target_modules=ALL)
            for name in ("held", "second", "third")}
REPEATS = 4


def per_replica(metrics_url: str, metric: str, model: str | None = None) -> dict[str, float]:
    """A scorer counter by replica (of `model` only, where given)."""
    found: dict[str, float] = {}
    for name, labels, value in scrape(metrics_url):
        if name == metric and (model is None or labels.get("model") == model):
            found[labels["replica"]] = found.get(labels["replica"], 0.0) + value
    return found


def test_an_adapters_requests_reach_one_replica_which_loads_it_once(small_model, tmp_path):
    made = write_adapters(small_model, tmp_path, ADAPTERS)
    config = tooling.small_model_config(small_model)
    args = config["applications"][0]["args"]
    args["adapters"] = [{"name": name, "path": str(adapter)}
                        for name, (adapter, _) in made.items()]
    args["lora"] = {"slots": 1}  # "held" is loaded at start; the others on first use
    worker = tooling.deployment(config, "ScoreWorker")
    worker.pop("autoscaling_config")
    worker.update(num_replicas=2)
    worker["ray_actor_options"]["num_cpus"] = 0.5
    with tooling.serving(config, tooling.FAST_METRICS_ENV) as svc:
        tooling.wait_until(lambda: len(replica_processes(svc, "ScoreWorker")) == 2, 240,
                           "two scorers", svc)
        metrics_url = svc.metrics_url()

        def score(model: str | None, k: int) -> None:
            body = {"query": f"query {k}", "items": ["an item", "another"],
                    "label_token_ids": [9, 11]} | ({"model": model} if model else {})
            r = httpx.post(f"{svc.url}/v1/score", json=body, timeout=120)
            assert r.status_code == 200, r.text

        def scored() -> dict[str, float]:
            return per_replica(metrics_url, "ray_ranker_items_scored_total")

        def counted(items: int) -> None:
            tooling.wait_until(lambda: sum(scored().values()) == items, 60,
                               f"{items} items counted", svc)

        # Until the ingress's router has heard of both scorers it routes to one: requests of
        # the model alone (routed by load) until both have scored some.
        sent = 0
        while len([n for n in scored().values() if n > 0]) < 2:
            assert sent < 40, "40 requests, and one scorer got none"
            score(None, sent)
            sent += 1
            counted(2 * sent)
        for model in ("second", "third"):
            for k in range(REPEATS):
                score(model, k)
        counted(2 * (sent + 2 * REPEATS))
        for model in ("second", "third"):
            loads = {replica: n for replica, n in per_replica(
                metrics_url, "ray_ranker_adapter_loads_total", model).items() if n}
            assert list(loads.values()) == [1.0], f"{model}: loads by replica {loads}"
