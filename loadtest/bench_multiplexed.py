"""Full models of `models` over HTTP on a GPU: what a model's first request costs, and what a load
costs the requests of the model already there (docs/BENCHMARKS.md, "Full models").

    python -m loadtest.bench_multiplexed --commit SHA --out docs/results/multiplexed_h100/bench.json

Serves configs/score-gpu.yaml (one scorer replica) with two more models of the same folder,
`second` and `third`, and `multiplex.max_models_per_replica: 1`, so that naming them in turn
makes each request load its model and unload the other. Measures, client side:
- a lone request of the model (p50 of LONE sequential requests);
- first uses: requests naming second, third, second, ... one at a time, idle;
- the same while a thread sends the model's own requests back to back, whose latencies and
  failures are counted (none may fail).
Every request: a 120-token query and 10 items of 180 tokens, as ids.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

import tools.service as tooling
from tools import git_commit, gpu_name
from tools.configs import shipped_app_config
from tools.stats import percentile

BODY = {"query": list(range(1000, 1120)), "items": [list(range(2000, 2180))] * 10,
        "label_token_ids": [9454, 2753]}
LONE, FIRST_USES = 100, 6


def _timed(client: httpx.Client, model: str | None) -> float:
    started = time.perf_counter()
    r = client.post("/v1/score", json=BODY | ({"model": model} if model else {}))
    if r.status_code != 200:
        raise RuntimeError(f"{model}: {r.status_code} {r.text}")
    return (time.perf_counter() - started) * 1e3


def _first_uses(client: httpx.Client) -> list[float]:
    return [_timed(client, name) for name in ["second", "third"] * (FIRST_USES // 2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default=None, help="the commit measured (default: HEAD)")
    parser.add_argument("--out", type=Path, default=Path("docs/results/multiplexed.json"))
    args = parser.parse_args()
    config = tooling.shipped_yaml("score-gpu.yaml")
    app = config["applications"][0]["args"]
    model = str(shipped_app_config("score-gpu.yaml").resolved_model_path())
    app["models"] = [{"name": name, "path": model} for name in ("second", "third")]
    app["multiplex"] = {"max_models_per_replica": 1}
    worker = tooling.deployment(config, "ScoreWorker")
    worker.pop("autoscaling_config", None)
    worker["num_replicas"] = 1
    with tooling.serving(config) as svc, httpx.Client(base_url=svc.url, timeout=120) as client:
        lone = [_timed(client, None) for _ in range(LONE)]
        idle = _first_uses(client)
        stop, background, failed = threading.Event(), [], []

        def the_models_own() -> None:
            with httpx.Client(base_url=svc.url, timeout=120) as own:
                while not stop.is_set():
                    try:
                        background.append(_timed(own, None))
                    except (RuntimeError, httpx.HTTPError) as exc:
                        failed.append(str(exc))

        thread = threading.Thread(target=the_models_own)
        thread.start()
        try:
            time.sleep(2)  # its steady state first
            under_load = _first_uses(client)
        finally:
            stop.set()
            thread.join(120)
    gpu = gpu_name()
    result = {
        "gpu": gpu, "commit": args.commit or git_commit(), "command": " ".join(sys.argv),
        "workload": "ids: 120-token query, 10 items x 180 tokens; models: two copies of the "
                    "served model, max_models_per_replica 1, one scorer replica",
        "lone_request_ms_p50": statistics.median(lone),
        "first_use_ms_idle": idle,
        "first_use_ms_under_load": under_load,
        "background": {"requests": len(background), "failed": len(failed),
                       "p50_ms": statistics.median(background) if background else None,
                       "p99_ms": percentile(background, 99),
                       "failures": failed[:5]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'figure':<42} {'ms':>8}")
    print(f"{'lone request of the model, p50':<42} {result['lone_request_ms_p50']:>8.1f}")
    print(f"{'first use, idle (median)':<42} {statistics.median(idle):>8.1f}")
    print(f"{'first use, under load (median)':<42} {statistics.median(under_load):>8.1f}")
    if background:
        print(f"{'the model under load: p50 / p99':<42} "
              f"{result['background']['p50_ms']:>8.1f} / {result['background']['p99_ms']:.1f}")
    print(f"the model's requests meanwhile: {len(background)}, failed {len(failed)}")


if __name__ == "__main__":
    main()
