"""A scorer replica killed under load loses no accepted request (`serve run`, small model,
two scorer replicas): the ingress sends the lost replica's jobs again, once, to the other."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from loadtest.loadgen import RateConfig, make_session, run_rate
from loadtest.prom import scrape
from loadtest.workload import RequestFactory, Workload
from tests.service import (FAST_METRICS_ENV, deployment, small_model_config, start_service,
                           stop_service, wait_until)

WORKLOAD = Workload(query_len=40, items=4, item_len=100, vocab=49152)  # ~450 tokens
# Sent just before the kill, ~1,600 tokens each: both scorers surely hold jobs when it comes.
BURST = Workload(query_len=40, items=4, item_len=400, vocab=49152)


def _burst_then_kill(url: str, victim, statuses: list[int]) -> None:
    bodies = [RequestFactory(BURST, f"burst{i}").next_bytes() for i in range(8)]
    with ThreadPoolExecutor(len(bodies)) as pool:
        posts = [pool.submit(httpx.post, f"{url}/v1/score", content=b, timeout=60,
                             headers={"Content-Type": "application/json"}) for b in bodies]
        time.sleep(0.3)  # the burst reached the scorers
        victim.kill()  # SIGKILL
        statuses.extend(p.result().status_code for p in posts)


def test_killing_a_scorer_replica_under_load_loses_no_request(small_model):
    config = small_model_config(small_model)
    # No refusals: one scorer alone is over capacity for a moment, and a 503 would hide a loss.
    config["applications"][0]["args"]["max_queued_tokens"] = 0
    worker = deployment(config, "ScoreWorker")
    worker.pop("autoscaling_config")
    worker.update(num_replicas=2)
    worker["ray_actor_options"]["num_cpus"] = 0.5
    svc = start_service(config, FAST_METRICS_ENV)
    try:
        wait_until(lambda: len(svc.replica_processes("ScoreWorker")) == 2, 60, "two scorers", svc)
        victim = svc.replica_processes("ScoreWorker")[0]
        burst_statuses: list[int] = []
        killer = threading.Timer(8.0, _burst_then_kill, (svc.url, victim, burst_statuses))
        killer.start()  # mid-run

        async def load():
            async with make_session() as session:
                return await run_rate(session, svc.url, WORKLOAD,
                                      RateConfig(rate=12, duration_s=20, warmup_s=2),
                                      progress=False)
        point, outcomes = asyncio.run(load())
        killer.join()
        print(f"\n{point}")
        assert not victim.is_running()
        assert point["failed"] == 0 and all(o.kind == "ok" for o in outcomes), point["failures"]
        assert burst_statuses == [200] * 8
        # The kill did hit jobs in flight, and they were sent again (metrics lag ~1 s).
        wait_until(lambda: sum(v for n, _, v in scrape(svc.metrics_url())
                               if n == "ray_ranker_scorer_retries_total") >= 1,
                   15, "a retry counted", svc)
        # Serve replaces the dead replica; the service is healthy again.
        wait_until(lambda: len(svc.replica_processes("ScoreWorker")) == 2, 90,
                   "dead scorer replaced", svc)
        assert httpx.get(f"{svc.url}/health", timeout=10).status_code == 200
    finally:
        stop_service(svc)
