"""One object per rate of a scaling sweep, appended to the results list (run_scale_gpu.sh).

Usage: python -m loadtest.scale_summary SWEEP.json CONFIG.yaml SCALE.json COMMAND
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml


def rows(sweep: dict, config: dict, gpu: str, command: str) -> list[dict]:
    deployments = {d["name"]: d for d in config["applications"][0]["deployments"]}
    common = {"gpu": gpu, "commit": sweep["meta"]["git_commit"], "command": command,
              "scorers": deployments["ScoreWorker"]["num_replicas"],
              "ingress_replicas": deployments["ScoreIngress"]["num_replicas"],
              "workload": sweep["workload"]}
    return [{**common, "offered_rps": p["offered_rps"], "items_per_s": p["achieved_items_per_s"],
             "p99_ms": p["latency_ms"]["p99"], "failed": p["failed"],
             "client_processes": p["client_processes"], "on_time_share": p["on_time_share"],
             "passed": p["passed"], "stages_ms": p["stages_ms"], "scorer_balance": p.get("scorers")}
            for p in sweep["points"]]


def main(argv: list[str]) -> None:
    import torch

    sweep_path, config_path, out_path, command = argv
    sweep = json.loads(Path(sweep_path).read_text())
    config = yaml.safe_load(Path(config_path).read_text())
    out = Path(out_path)
    done = json.loads(out.read_text()) if out.exists() else []
    new = rows(sweep, config, torch.cuda.get_device_name(), command)
    out.write_text(json.dumps(done + new, indent=1) + "\n")
    for r in new:
        balance = (r["scorer_balance"] or {}).get("imbalance_queued_tokens")
        print(f"scorers {r['scorers']} offered {r['offered_rps']:g} req/s: {r['items_per_s']:.0f} "
              f"items/s, P99 {r['p99_ms']} ms, failed {r['failed']}, imbalance {balance}")


if __name__ == "__main__":
    main(sys.argv[1:])
