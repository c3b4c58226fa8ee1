"""A scorer replica killed under load loses no accepted request (`serve run`, small model,
two scorer replicas): the ingress sends the lost replica's jobs again, once, to the other."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import tools.service as tooling
from tests.support.service import replica_processes, without_refusals
from tools.http_client import make_session
from tools.loadgen import RateConfig, run_rate
from tools.prom import scrape
from tools.workload import RequestFactory, Workload

pytestmark = pytest.mark.service  # starts Ray (the slow tier)

WORKLOAD = Workload(query_len=40, items=4, item_len=100, vocab=49152)  # ~450 tokens
# Sent before the kill, ~6,400 tokens each: seconds of work for each scorer, longer than the
# metrics take to show it, so a scorer seen busy is still busy when it is killed (a quarter of
# it was not always, once per-block attention made the CPU path faster).
BURST = Workload(query_len=40, items=8, item_len=800, vocab=49152)
BURST_REQUESTS = 12


def _busy_scorers(metrics_url: str) -> int:
    """Scorer replicas whose queued + inflight tokens are above zero in Prometheus."""
    tokens: dict[str, float] = {}
    for name, labels, value in scrape(metrics_url):
        if name == "ray_ranker_queue_tokens" and labels.get("deployment") == "ScoreWorker":
            replica = labels.get("replica", "")
            tokens[replica] = tokens.get(replica, 0.0) + value
    return sum(1 for v in tokens.values() if v > 0)


def _burst_then_kill(svc, victim, statuses: list[int]) -> None:
    """The fault at a moment we observe, not guess: once both scorers hold burst jobs."""
    bodies = [RequestFactory(BURST, f"burst{i}").next_bytes() for i in range(BURST_REQUESTS)]
    with ThreadPoolExecutor(len(bodies)) as pool:
        posts = [pool.submit(httpx.post, f"{svc.url}/v1/score", content=b, timeout=120,
                             headers={"Content-Type": "application/json"}) for b in bodies]
        metrics_url = svc.metrics_url()
        tooling.wait_until(lambda: _busy_scorers(metrics_url) == 2, 60, "both scorers busy",
                           svc, every_s=0.2)
        victim.kill()  # SIGKILL
        statuses.extend(p.result().status_code for p in posts)


def test_killing_a_scorer_replica_under_load_loses_no_request(small_model):
    # On a busy machine the one scorer left is over capacity for a while, and a 503 there would
    # hide a loss.
    config = without_refusals(tooling.small_model_config(small_model))
    worker = tooling.deployment(config, "ScoreWorker")
    worker.pop("autoscaling_config")
    worker.update(num_replicas=2)
    worker["ray_actor_options"]["num_cpus"] = 0.5
    svc = tooling.start_service(config, tooling.FAST_METRICS_ENV)
    try:
        tooling.wait_until(lambda: len(replica_processes(svc, "ScoreWorker")) == 2, 240,
                           "two scorers", svc)
        victim = replica_processes(svc, "ScoreWorker")[0]
        burst_statuses: list[int] = []
        killer = threading.Timer(8.0, _burst_then_kill, (svc, victim, burst_statuses))
        killer.start()  # mid-run

        async def load():
            async with make_session() as session:
                return await run_rate(session, svc.url, WORKLOAD,
                                      # 8/s: about half of what one scorer takes here, so
                                      # the survivor's backlog stays far below the timeout.
                                      RateConfig(rate=8, duration_s=20, warmup_s=2,
                                                 timeout_s=120),
                                      progress=False)
        point, outcomes = asyncio.run(load())
        killer.join()
        print(f"\n{point}")
        assert not victim.is_running()
        assert point["failed"] == 0 and all(o.kind == "ok" for o in outcomes), point["failures"]
        assert burst_statuses == [200] * BURST_REQUESTS
        # The kill did hit jobs in flight, and they were sent again (metrics lag ~1 s).
        tooling.wait_until(lambda: sum(v for n, _, v in scrape(svc.metrics_url())
                                       if n == "ray_ranker_scorer_retries_total") >= 1,
                           60, "a retry counted", svc)
        # Serve replaces the dead replica; the service is healthy again.
        tooling.wait_until(lambda: len(replica_processes(svc, "ScoreWorker")) == 2, 240,
                           "dead scorer replaced", svc)
        assert httpx.get(f"{svc.url}/health", timeout=10).status_code == 200
    finally:
        tooling.stop_service(svc)
