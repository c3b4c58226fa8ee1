"""Test-only views of a service started by tools/service.py: its replica processes (to kill or
count), a metric per replica, its logs searched for secrets, and a config that refuses nothing."""

from __future__ import annotations

import psutil

from tools.prom import scrape
from tools.service import Service, deployment


def without_refusals(config: dict) -> dict:
    """No admission limit anywhere (the scorer's queue-wait bound, ingress proxy queue): for
    tests where a 503 would hide a lost request or stop the load that scaling needs. Edits
    in place."""
    config["applications"][0]["args"]["scheduler"].update(max_queue_wait_s=0)
    ingress = deployment(config, "ScoreIngress")
    ingress.update(max_ongoing_requests=1024)
    for key in ("max_queued_requests", "backpressure_config"):
        ingress.pop(key)
    return config


def replica_processes(service: Service, deployment_name: str) -> list[psutil.Process]:
    """Live replica processes of a deployment (Ray names them ServeReplica:APP:DEPLOYMENT)."""
    marker = f"ServeReplica:score:{deployment_name}"
    found = []
    for child in psutil.Process(service.proc.pid).children(recursive=True):
        try:
            if any(marker in arg for arg in child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def by_replica(service: Service, metric: str, **labels) -> dict[str, float]:
    """`metric` per replica, summed over the series with `labels`."""
    counts: dict[str, float] = {}
    for name, have, value in scrape(service.metrics_url()):
        if name == metric and all(have.get(k) == v for k, v in labels.items()):
            counts[have["replica"]] = counts.get(have["replica"], 0.0) + value
    return counts


def lines_containing(service: Service, secrets: list[str]) -> list[str]:
    """`file:line number` of each line of serve run's output and of the service's Ray session
    logs that holds one of `secrets` (API keys must appear in none)."""
    found = []
    logs = sorted((service.session_dir() / "logs").rglob("*"))
    for path in [service.workdir / service.LOG_FILE, *logs]:
        if not path.is_file():
            continue
        with open(path, errors="replace") as text:
            found += [f"{path}:{number}" for number, line in enumerate(text, 1)
                      if any(secret in line for secret in secrets)]
    return found
