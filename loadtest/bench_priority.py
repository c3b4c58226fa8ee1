"""Priority classes under load on one GPU (docs/OPERATIONS.md, "Priorities"; the tenancy issue's
figure): an online key at 20% of capacity while a bulk key (`priority=bulk`) offers 3× it.

    python -m loadtest.bench_priority --out docs/results/priority/priority.json [--commit C]

Starts configs/score-gpu.yaml with API keys on (two keys: `online`, and `bulk` with
priority=bulk), then, on the bench shape as text (120-token query, 10 items of 180):
1. bulk alone at 3× the nominal capacity: what the service serves past capacity (capacity);
2. online alone at 20% of that: its P99 (alone);
3. bulk at 3× again, and online at 20% from within it: online's P99 and refusals, and the
   items/s served to both.
Bulk's clients are processes of their own (tools/client_pool.py: they send $RANKER_API_KEY);
online's is this process (an explicit header), at well under one client's rate. Prints a table,
online's Server-Timing stages (where its wait beside bulk is) and the host's CPU per run
(tools/host_cpu.py: busy share, cores by Serve deployment and client), writes JSON with the
command, GPU, commit and workload.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.configs import shipped_yaml
from tools.host_cpu import HostCpu
from tools.http_client import API_KEY_ENV, make_session
from tools.loadgen import RateConfig, run_rate
from tools.service import serving
from tools.workload import Workload

REPO_ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(query_len=120, items=10, item_len=180)  # the headline's bench shape
NOMINAL_ITEMS_PER_S = 2900.0  # the bench shape over HTTP on one H200 (docs/BENCHMARKS.md)
BULK_MULTIPLE, ONLINE_SHARE = 3.0, 0.2
ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
       "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}


def _config(keys_file: Path) -> dict:
    config = shipped_yaml("score-gpu.yaml")
    config["applications"][0]["args"]["auth"] = {"api_keys_file": str(keys_file)}
    return config


def _gpu() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        return "none"


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                          text=True).stdout.strip() or "unknown"


async def _load(url: str, key: str, rate: float, duration_s: float, warmup_s: float,
                clients: int | None) -> dict:
    workload = Workload(text="natural", vocab=151_643, **SHAPE)  # the Qwen3 tokenizer's
    cfg = RateConfig(rate, duration_s=duration_s, warmup_s=warmup_s, seed=f"priority-{key[:4]}",
                     clients=clients or 0)
    async with make_session({"Authorization": f"Bearer {key}"}) as session:
        with HostCpu() as cpu:
            point, _ = await run_rate(session, url, workload, cfg, progress=False)
    point["host_cpu"] = cpu.summary()
    return point


def _summary(point: dict) -> dict:
    return {"offered_rps": point["offered_rps"], "achieved_items_per_s":
            point["achieved_items_per_s"], "failed": point["failed"],
            "failures": point["failures"], "p50_ms": point["latency_ms"]["p50"],
            "p99_ms": point["latency_ms"]["p99"], "client_processes": point["client_processes"],
            # where the time went (Server-Timing; tools/stats.py::where_time_went): the stages
            # of online's wait beside bulk
            "stages_ms": point.get("stages_ms", {}),
            "host_cpu": point["host_cpu"]}


async def measure(url: str, keys: dict[str, str]) -> dict:
    os.environ[API_KEY_ENV] = keys["bulk"]  # what bulk's client processes send
    bulk_rps = BULK_MULTIPLE * NOMINAL_ITEMS_PER_S / SHAPE["items"]
    capacity = await _load(url, keys["bulk"], bulk_rps, 12.0, 4.0, None)
    served = capacity["achieved_items_per_s"]
    online_rps = round(ONLINE_SHARE * served / SHAPE["items"], 1)
    alone = await _load(url, keys["online"], online_rps, 15.0, 3.0, 1)
    # Bulk measures 8..26 s of its run; online starts at 6 s and measures 8..26 s as well.
    bulk = asyncio.create_task(_load(url, keys["bulk"], bulk_rps, 18.0, 8.0, None))
    await asyncio.sleep(6.0)
    together = await _load(url, keys["online"], online_rps, 18.0, 2.0, 1)
    bulk_point = await bulk
    total = together["achieved_items_per_s"] + bulk_point["achieved_items_per_s"]
    return {
        "bulk_alone": _summary(capacity), "online_alone": _summary(alone),
        "online_with_bulk": _summary(together), "bulk_with_online": _summary(bulk_point),
        "capacity_items_per_s": served,
        "online_p99_ratio": round(together["latency_ms"]["p99"] / alone["latency_ms"]["p99"], 3),
        "online_refused": together["failed"],
        "total_served_ratio": round(total / served, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", help="the commit measured, where the tree is a copy that "
                        "git does not describe (the GPU machine's)")
    args = parser.parse_args()
    keys = {"online": f"rk-online-{secrets.token_urlsafe(18)}",
            "bulk": f"rk-bulk-{secrets.token_urlsafe(18)}"}
    keys_file = Path(tempfile.mkdtemp(prefix="priority-")) / "keys"
    keys_file.write_text(f"online:{keys['online']}\nbulk:{keys['bulk']} priority=bulk\n")
    with serving(_config(keys_file), ENV) as service:
        figures = asyncio.run(measure(service.url, keys))
    out = {"meta": {"tool": "loadtest/bench_priority.py", "command": " ".join(sys.argv),
                    "gpu": _gpu(), "commit": args.commit or _commit(),
                    "workload": {**SHAPE, "text": "natural", "bulk_multiple": BULK_MULTIPLE,
                                 "online_share": ONLINE_SHARE}},
           **figures}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    rows = [("bulk alone at 3×", figures["bulk_alone"]), ("online alone", figures["online_alone"]),
            ("online with bulk", figures["online_with_bulk"]),
            ("bulk with online", figures["bulk_with_online"])]
    print(f"{'run':<18} {'offered req/s':>13} {'items/s':>9} {'failed':>7} {'p50 ms':>7} "
          f"{'p99 ms':>7}")
    for name, row in rows:
        print(f"{name:<18} {row['offered_rps']:>13} {row['achieved_items_per_s']:>9} "
              f"{row['failed']:>7} {row['p50_ms']:>7} {row['p99_ms']:>7}")
    for name, row in rows[1:3]:
        print(f"{name}, Server-Timing p50 / p99 ms: " + ", ".join(
            f"{stage} {v['p50']} / {v['p99']}" for stage, v in row["stages_ms"].items()))
    for name, row in rows:
        cpu = row["host_cpu"]
        print(f"{name}, host CPU busy p50 / p99 %: {cpu['host_busy_percent']['p50']} / "
              f"{cpu['host_busy_percent']['p99']}; cores p50 / p99: " + ", ".join(
                  f"{group} {v['p50']} / {v['p99']}" for group, v in cpu["cores_by_group"].items()))
    print(f"online P99 with bulk ÷ alone {figures['online_p99_ratio']}, online refused "
          f"{figures['online_refused']}, total served ÷ capacity {figures['total_served_ratio']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
