"""Queue-depth autoscaling of the scorer against the real app (`serve run`, small model):
sustained load scales it from 1 replica up, and back to 1 after, with no failed request.

The load is closed-loop (CONCURRENCY clients, each sending again as soon as it is answered), so
the scorers' queue depth, the autoscaling signal, is the same on a fast or a busy machine; the
test waits on the state it observes (replicas serving, processes left), with generous deadlines,
and never asserts how long scaling took. That figure is a benchmark: `python -m tools.ramp`.
"""

import asyncio
import time

import pytest

import tools.service as tooling
from tests.support.service import replica_processes, without_refusals
from tools.http_client import make_session
from tools.loadgen import run_closed_loop
from tools.prom import scrape, service_sample
from tools.stats import OK
from tools.workload import Workload

pytestmark = pytest.mark.service  # starts Ray (the slow tier)

WORKLOAD = Workload(query_len=40, items=4, item_len=40, vocab=49152)  # ~200 tokens
# 12 requests in the service ≈ 2,400 tokens queued or running: with target_tokens_per_replica
# 1024 the policy asks for ceil(2400 / 1024) = 3 replicas whatever the machine's speed.
CONCURRENCY = 12
# Deadlines, not expectations: a new replica imports torch and loads its model on a 2-core box
# that the load itself saturates (15-35 s seen on the CI machine; the deadline is 8x the worst).
SCALE_UP_DEADLINE_S = 300
SCALE_DOWN_DEADLINE_S = 300


def _serving_replicas(metrics_url: str, previous: dict[str, float]) -> int:
    """Replicas whose items-scored counter grew since `previous` (updated in place)."""
    now = service_sample(scrape(metrics_url)).items_scored
    serving = sum(1 for replica, items in now.items() if items > previous.get(replica, 0))
    previous.clear()
    previous.update(now)
    return serving


async def _load_until_serving(url: str, metrics_url: str, replicas: int) -> tuple[list, float]:
    """Closed-loop load until `replicas` scorers serve at once; returns (outcomes, seconds)."""
    stop = asyncio.Event()
    async with make_session() as session:
        load = asyncio.create_task(run_closed_loop(session, url, WORKLOAD, CONCURRENCY, stop))
        started, previous, serving = time.monotonic(), {}, 0
        try:
            while serving < replicas and time.monotonic() - started < SCALE_UP_DEADLINE_S:
                await asyncio.sleep(1.0)
                serving = await asyncio.to_thread(_serving_replicas, metrics_url, previous)
        finally:
            stop.set()
            outcomes = await load
    return outcomes, (time.monotonic() - started) if serving >= replicas else None


def test_load_scales_scorers_up_and_back_down_without_failures(small_model):
    # Nothing is refused here: the load waits while replicas are added.
    config = without_refusals(tooling.small_model_config(small_model))
    worker = tooling.deployment(config, "ScoreWorker")
    worker["ray_actor_options"]["num_cpus"] = 0.5  # 3 replicas fit Ray's 2 logical CPUs
    worker["autoscaling_config"].update(max_replicas=3, upscale_delay_s=1, downscale_delay_s=10)
    worker["autoscaling_config"]["policy"]["policy_kwargs"] = {"target_tokens_per_replica": 1024}
    svc = tooling.start_service(config, tooling.FAST_METRICS_ENV)
    try:
        assert len(replica_processes(svc, "ScoreWorker")) == 1
        outcomes, seconds = asyncio.run(_load_until_serving(svc.url, svc.metrics_url(), 2))
        failures = [o.kind for o in outcomes if o.kind != OK]
        print(f"\n{len(outcomes)} requests, failures {failures}; two scorers serving after "
              f"{seconds} s of load")
        assert seconds is not None, f"not two scorers serving after {SCALE_UP_DEADLINE_S} s"
        assert outcomes and not failures
        # Load gone: the extra replicas drain (graceful shutdown) and stop.
        tooling.wait_until(lambda: len(replica_processes(svc, "ScoreWorker")) == 1,
                           SCALE_DOWN_DEADLINE_S, "back to one scorer replica", svc)
    finally:
        tooling.stop_service(svc)
