"""Variants of configs/score-gpu.yaml for the scaling runs (loadtest/run_scale_gpu.sh).

Usage: python -m loadtest.scale_config MODE OUT.yaml
  fixed1 / fixed2 / fixed4: exactly 1 / 2 / 4 scorer replicas (no autoscaling);
  auto: the shipped config (load autoscaling 1..2) and a token queue of 4M tokens; the shipped
  max_queue_wait_s still refuses (503) what waits longer than it while the second replica starts.
Every mode runs the shipped config's ingress replicas per scorer (its ingress count ÷ its
max_replicas) for each scorer it may run; admission follows the running scorers by itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tools.configs import shipped_yaml


def variant(mode: str) -> dict:
    config = shipped_yaml("score-gpu.yaml")
    deployments = {d["name"]: d for d in config["applications"][0]["deployments"]}
    ingress = deployments["ScoreIngress"]
    worker = deployments["ScoreWorker"]
    # The shipped ingress count is sized for its max_replicas scorers (tokenizing CPUs): the
    # same count per scorer, so the front door does not limit the GPUs.
    per_scorer = ingress["num_replicas"] // worker["autoscaling_config"]["max_replicas"]
    if mode in ("fixed1", "fixed2", "fixed4"):
        scorers = int(mode[-1])
        worker.pop("autoscaling_config")
        worker["num_replicas"] = scorers
    elif mode == "auto":
        scorers = worker["autoscaling_config"]["max_replicas"]
        config["applications"][0]["args"]["scheduler"]["max_queue_wait_s"] = 10
    else:
        raise SystemExit(f"mode must be fixed1, fixed2, fixed4 or auto, not {mode!r}")
    ingress["num_replicas"] = per_scorer * scorers
    return config


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(yaml.safe_dump(variant(sys.argv[1]), sort_keys=False))
