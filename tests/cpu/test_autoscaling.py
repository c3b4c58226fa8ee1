"""Queue-depth autoscaling of the scorer against the real app (`serve run`, small model):
a load ramp scales it from 1 replica up, and back to 1 after, with no failed request."""

import asyncio
import json
import os
from pathlib import Path

from loadtest.ramp import parse_phases, run_ramp, summarize, timeline
from loadtest.workload import Workload
from tests.service import (FAST_METRICS_ENV, deployment, small_model_config, start_service,
                           stop_service, wait_until)

# One scorer replica answers ~20 of these per second on the CI machine: 26/s overloads it.
WORKLOAD = Workload(query_len=40, items=4, item_len=40, vocab=49152)
PHASES = "10:4,30:26,40:4"
# Target on a 16-core host is 15 s (loadtest/results/); this 2-core box is saturated by the
# load itself while the new replica imports torch and loads its model.
NEW_REPLICA_SERVING_BOUND_S = 30


def test_ramp_scales_up_and_back_down_without_failures(small_model, tmp_path):
    config = small_model_config(small_model)
    # Nothing is refused here: the backlog of the ramp waits while replicas are added.
    config["applications"][0]["args"]["max_queued_tokens"] = 0
    ingress = deployment(config, "ScoreIngress")
    ingress.update(max_ongoing_requests=1024)
    for key in ("max_queued_requests", "backpressure_config"):
        ingress.pop(key)
    worker = deployment(config, "ScoreWorker")
    worker["ray_actor_options"]["num_cpus"] = 0.5  # 3 replicas fit Ray's 2 logical CPUs
    worker["autoscaling_config"].update(max_replicas=3, upscale_delay_s=1, downscale_delay_s=10)
    worker["autoscaling_config"]["policy"]["policy_kwargs"] = {"target_tokens_per_replica": 1024}
    svc = start_service(config, FAST_METRICS_ENV)
    try:
        processes = []
        outcomes, ticks = asyncio.run(run_ramp(
            svc.url, WORKLOAD, parse_phases(PHASES), metrics_url=svc.metrics_url(),
            on_tick=lambda t: processes.append((t.t, len(svc.replica_processes("ScoreWorker"))))))
        rows = timeline(outcomes, ticks, parse_phases(PHASES))
        summary = summarize(outcomes, rows, parse_phases(PHASES))
        out = Path(os.environ.get("RAMP_OUT", tmp_path / "ramp.json"))
        out.write_text(json.dumps({"summary": summary, "timeline": rows,
                                   "processes": processes}, indent=1))
        print(f"\n{json.dumps(summary)}\nscorer processes over time: {processes}")
        assert summary["failed"] == 0, summary
        assert summary["max_serving_replicas"] >= 2, rows
        assert summary["second_replica_serving_after_s"] <= NEW_REPLICA_SERVING_BOUND_S
        # After the ramp the extra replicas drain (graceful shutdown) and stop.
        wait_until(lambda: len(svc.replica_processes("ScoreWorker")) == 1, 90,
                   "back to one scorer replica", svc)
    finally:
        stop_service(svc)
