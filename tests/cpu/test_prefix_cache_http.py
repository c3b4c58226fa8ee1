"""The prefix cache behind a real `serve run` with two scorer replicas (small model, CPU): repeats
of a query reach the replica that holds it (affinity routing), hits score what the first, missed
request scored, the metrics count hits and misses, and a killed scorer loses only its cache."""

from __future__ import annotations

import random

import httpx
import pytest

import tools.service as tooling
from tests.support.service import replica_processes
from tools.prom import scrape

pytestmark = pytest.mark.service  # starts Ray (the slow tier)

QUERIES, REPEATS = 6, 4
TOL = 1e-4  # a hit runs other matmul shapes than the miss (fp32 on CPU)


def lookups(metrics_url: str, per_replica: bool = False) -> dict:
    """ranker_prefix_cache_lookups by result, summed over the scorer replicas (or by replica:
    its lookups of any result)."""
    found: dict[str, float] = {}
    for name, labels, value in scrape(metrics_url):
        if name == "ray_ranker_prefix_cache_lookups_total":
            key = labels["replica"] if per_replica else labels["result"]
            found[key] = found.get(key, 0.0) + value
    return found


def body(rng: random.Random) -> dict:
    return {"query": [rng.randrange(2, 49000) for _ in range(120)],
            "items": [[rng.randrange(2, 49000) for _ in range(20)] for _ in range(3)],
            "label_token_ids": [9, 11]}


def test_repeats_of_a_query_hit_one_replica_and_survive_its_loss(small_model):
    config = tooling.small_model_config(small_model)
    config["applications"][0]["args"]["engine"].update(
        prefix_cache={"tokens": 4096, "min_tokens": 64})
    worker = tooling.deployment(config, "ScoreWorker")
    worker.pop("autoscaling_config")
    worker.update(num_replicas=2)
    worker["ray_actor_options"]["num_cpus"] = 0.5
    rng = random.Random(7)
    svc = tooling.start_service(config, tooling.FAST_METRICS_ENV)
    try:
        tooling.wait_until(lambda: len(replica_processes(svc, "ScoreWorker")) == 2, 240,
                           "two scorers", svc)
        metrics_url = svc.metrics_url()

        def score(request: dict) -> list[list[float]]:
            r = httpx.post(f"{svc.url}/v1/score", json=request, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()["scores"]

        def counted(sent: int) -> dict[str, float]:
            """The lookups once all `sent` are published."""
            tooling.wait_until(lambda: sum(lookups(metrics_url).values()) == sent, 60,
                               f"{sent} lookups counted (last: {lookups(metrics_url)})", svc)
            return lookups(metrics_url)

        # Until the ingress's router has heard of both scorers it routes to one. Distinct queries
        # until both have computed one: from then on, the router ranks both.
        sent = 0
        while sum(1 for n in lookups(metrics_url, per_replica=True).values() if n > 0) < 2:
            assert sent < 40, "40 distinct queries, and one scorer got none"
            score(body(rng))
            sent += 1
            counted(sent)
        before = counted(sent)

        bodies = [body(rng) for _ in range(QUERIES)]
        first = [score(b) for b in bodies]
        for _ in range(REPEATS - 1):
            for b, want in zip(bodies, first, strict=True):
                got = score(b)
                assert max(abs(x - y) for g, w in zip(got, want) for x, y in zip(g, w)) <= TOL
        after = counted(sent + QUERIES * REPEATS)
        # Affinity: each query computed once, on one replica, and hit there afterwards (Serve's
        # default routing would compute most queries on both: about 11 misses of 6 queries).
        assert {k: after[k] - before[k] for k in after} == {
            "miss": QUERIES, "hit": QUERIES * (REPEATS - 1), "partial": 0, "bypass": 0}

        victim = replica_processes(svc, "ScoreWorker")[0]
        victim.kill()
        tooling.wait_until(lambda: len(replica_processes(svc, "ScoreWorker")) == 2
                           and victim.pid not in [p.pid for p in
                                                  replica_processes(svc, "ScoreWorker")],
                           240, "killed scorer replaced", svc)
        # Its queries are computed again (by whichever replica now owns them); scores unchanged.
        for b, want in zip(bodies, first, strict=True):
            got = score(b)
            assert max(abs(x - y) for g, w in zip(got, want) for x, y in zip(g, w)) <= TOL
    finally:
        tooling.stop_service(svc)


KEYS = {"search": "rk-search-0123456789abcdef", "ads": "rk-ads-0123456789abcdefghi",
        "feed-1": "rk-feed1-0123456789abcdefg", "feed-2": "rk-feed2-0123456789abcdefg"}


def test_a_key_never_hits_another_keys_cached_query(small_model):
    """Per-key isolation (auth.shared_cache): the same query sent with another key is a miss,
    computed anew and scored alike; a key hits its own; two keys of one shared_cache group hit
    each other's. With one scorer replica, so the counters are the one cache's."""
    config = tooling.small_model_config(small_model)
    args = config["applications"][0]["args"]
    args["engine"].update(prefix_cache={"tokens": 4096, "min_tokens": 64})
    args["auth"] = {"api_keys_env": "RANKER_TEST_KEYS",
                    "shared_cache": {"feed": ["feed-1", "feed-2"]}}
    worker = tooling.deployment(config, "ScoreWorker")
    worker.pop("autoscaling_config")
    worker.update(num_replicas=1)
    env = {**tooling.FAST_METRICS_ENV,
           "RANKER_TEST_KEYS": ",".join(f"{i}:{k}" for i, k in KEYS.items())}
    svc = tooling.start_service(config, env)
    try:
        metrics_url = svc.metrics_url()
        request = body(random.Random(11))
        want, sent = None, 0
        for key_id, result in (("search", "miss"), ("search", "hit"), ("ads", "miss"),
                               ("feed-1", "miss"), ("feed-2", "hit"), ("ads", "hit")):
            before = lookups(metrics_url)
            r = httpx.post(f"{svc.url}/v1/score", json=request, timeout=120,
                           headers={"Authorization": f"Bearer {KEYS[key_id]}"})
            assert r.status_code == 200, r.text
            sent += 1
            tooling.wait_until(lambda n=sent: sum(lookups(metrics_url).values()) == n, 60,
                               f"{sent} lookups counted", svc)
            after = lookups(metrics_url)
            counted = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            assert counted == {**dict.fromkeys(counted, 0), result: 1}, (key_id, counted)
            got = r.json()["scores"]
            want = want or got
            assert max(abs(x - y) for g, w in zip(got, want) for x, y in zip(g, w)) <= TOL
    finally:
        tooling.stop_service(svc)
