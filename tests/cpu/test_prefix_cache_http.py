"""The prefix cache behind a real `serve run` with two scorer replicas (small model, CPU): repeats
of a query reach the replica that holds it (affinity routing), hits score what the first, missed
request scored, the metrics count hits and misses, and a killed scorer loses only its cache."""

from __future__ import annotations

import random

import httpx
import pytest

import loadtest.service as tooling
from loadtest.prom import scrape

pytestmark = pytest.mark.service  # starts Ray (the slow tier)

QUERIES, REPEATS = 6, 4
TOL = 1e-4  # a hit runs other matmul shapes than the miss (fp32 on CPU)


def lookups(metrics_url: str) -> dict[str, float]:
    """ranker_prefix_cache_lookups by result, summed over the scorer replicas."""
    found: dict[str, float] = {}
    for name, labels, value in scrape(metrics_url):
        if name == "ray_ranker_prefix_cache_lookups_total":
            found[labels["result"]] = found.get(labels["result"], 0.0) + value
    return found


def test_repeats_of_a_query_hit_one_replica_and_survive_its_loss(small_model):
    config = tooling.small_model_config(small_model)
    config["applications"][0]["args"]["engine"].update(prefix_cache_tokens=4096,
                                                       prefix_cache_min_tokens=64)
    worker = tooling.deployment(config, "ScoreWorker")
    worker.pop("autoscaling_config")
    worker.update(num_replicas=2)
    worker["ray_actor_options"]["num_cpus"] = 0.5
    rng = random.Random(7)
    bodies = [{"query": [rng.randrange(2, 49000) for _ in range(120)],
               "items": [[rng.randrange(2, 49000) for _ in range(20)] for _ in range(3)],
               "label_token_ids": [9, 11]} for _ in range(QUERIES)]
    svc = tooling.start_service(config, tooling.FAST_METRICS_ENV)
    try:
        tooling.wait_until(lambda: len(svc.replica_processes("ScoreWorker")) == 2, 240,
                           "two scorers", svc)

        def send_all() -> list[list[list[float]]]:
            answers = []
            for body in bodies:
                r = httpx.post(f"{svc.url}/v1/score", json=body, timeout=120)
                assert r.status_code == 200, r.text
                answers.append(r.json()["scores"])
            return answers

        def assert_same_scores(answers) -> None:
            for got, want in zip(answers, first, strict=True):
                diff = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w))
                assert diff <= TOL

        metrics_url = svc.metrics_url()

        def settled_lookups(sent: int) -> dict[str, float]:
            """The counters once every one of `sent` lookups is published."""
            tooling.wait_until(lambda: sum(lookups(metrics_url).values()) == sent, 60,
                               f"{sent} lookups counted (last: {lookups(metrics_url)})", svc)
            return lookups(metrics_url)

        first = send_all()
        # Until the ingress's router has heard of both scorers, a query may go to either: send
        # rounds until one computes no query anew (each can miss at most once per replica).
        before, rounds = settled_lookups(QUERIES), 1
        while True:
            assert_same_scores(send_all())
            rounds += 1
            now = settled_lookups(rounds * QUERIES)
            if now["miss"] == before["miss"] or rounds == 4:
                break
            before = now
        assert now["miss"] <= 2 * QUERIES and now["bypass"] == 0
        # Settled: every repeat is a hit, on the replica that computed it.
        for _ in range(REPEATS):
            assert_same_scores(send_all())
        after = settled_lookups((rounds + REPEATS) * QUERIES)
        assert after["miss"] == now["miss"] and after["hit"] == now["hit"] + REPEATS * QUERIES

        victim = svc.replica_processes("ScoreWorker")[0]
        victim.kill()
        tooling.wait_until(lambda: len(svc.replica_processes("ScoreWorker")) == 2
                           and victim.pid not in [p.pid for p in
                                                  svc.replica_processes("ScoreWorker")],
                           240, "killed scorer replaced", svc)
        # Its queries are computed again (by whichever replica now owns them); scores unchanged.
        assert_same_scores(send_all())
    finally:
        tooling.stop_service(svc)
