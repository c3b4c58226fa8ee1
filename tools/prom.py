"""Read the service's Prometheus metrics from a Ray node's metrics export port.

Ray serves every process's metrics of a node at http://NODE:PORT/metrics (names prefixed
`ray_`). `find_metrics_url` finds the port of a local cluster from its session directory.
That port is not behind Ray's token authentication (the dashboard is: tools/ray_dashboard.py),
so scraping needs no token; tools/check_dashboard.py checks it with authentication on.
"""

from __future__ import annotations

import glob
import os
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

RAY_TMP = "/tmp/ray"


def find_metrics_url(session_dir: str | None = None, host: str = "127.0.0.1") -> str:
    """The metrics URL of a local Ray node; default: the newest session on this machine."""
    session_dir = session_dir or os.path.join(RAY_TMP, "session_latest")
    files = glob.glob(os.path.join(session_dir, "metrics_export_port_*"))
    if not files:
        raise FileNotFoundError(f"no metrics_export_port_* in {session_dir}: is Ray running?")
    with open(files[0]) as f:
        return f"http://{host}:{int(f.read().strip())}/metrics"


def scrape(url: str, timeout_s: float = 5.0) -> list[tuple[str, dict[str, str], float]]:
    """Every sample as (name, labels, value)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        text = resp.read().decode()
    return [(s.name, s.labels, s.value)
            for family in text_string_to_metric_families(text) for s in family.samples]


@dataclass
class ServiceSample:
    """The scorer deployment's state in one scrape."""

    target_replicas: int | None = None  # what the autoscaler asks for
    queued_by_replica: dict[str, float] = field(default_factory=dict)  # tokens, per replica id
    inflight_by_replica: dict[str, float] = field(default_factory=dict)
    items_scored: dict[str, float] = field(default_factory=dict)  # per replica id
    dropped: float = 0.0  # sequences dropped because their caller went away
    rejected: float = 0.0  # requests refused by a full token queue

    @property
    def queued_tokens(self) -> float:  # summed over replicas
        return sum(self.queued_by_replica.values())

    @property
    def inflight_tokens(self) -> float:
        return sum(self.inflight_by_replica.values())


def service_sample(samples: list[tuple[str, dict[str, str], float]],
                   deployment: str = "ScoreWorker") -> ServiceSample:
    out = ServiceSample()
    for name, labels, value in samples:
        if labels.get("deployment") != deployment:
            continue
        if name == "ray_serve_autoscaling_target_replicas":
            out.target_replicas = int(value)
        elif name == "ray_ranker_queue_tokens":
            by_replica = (out.queued_by_replica if labels.get("state") == "queued"
                          else out.inflight_by_replica)
            by_replica[labels.get("replica", "")] = value
        elif name == "ray_ranker_items_scored_total":
            out.items_scored[labels.get("replica", "")] = value
        elif name == "ray_ranker_sequences_dropped_total":
            out.dropped += value
        elif name == "ray_ranker_requests_rejected_total":
            out.rejected += value
    return out


def imbalance(per_replica: dict[str, float]) -> float | None:
    """max ÷ mean over replicas (1.0: even); None without replicas or load."""
    if not per_replica:
        return None
    mean = sum(per_replica.values()) / len(per_replica)
    return round(max(per_replica.values()) / mean, 3) if mean > 0 else None


def scorer_balance(samples: list[ServiceSample]) -> dict:
    """How evenly the scorer replicas were loaded over `samples` (one scrape each): per replica
    its mean queued tokens and mean outstanding (queued + running) tokens over the samples, and
    the items it scored between the first and last sample; each imbalance is max ÷ mean of one
    of these across the replicas seen in every sample."""
    if not samples:
        return {"samples": 0}
    replicas = set.intersection(*(set(s.queued_by_replica) for s in samples))
    queued = {r: sum(s.queued_by_replica[r] for s in samples) / len(samples) for r in replicas}
    outstanding = {r: queued[r] + sum(s.inflight_by_replica.get(r, 0.0) for s in samples)
                   / len(samples) for r in replicas}
    first, last = samples[0].items_scored, samples[-1].items_scored
    items = {r: last.get(r, 0.0) - first.get(r, 0.0) for r in replicas}
    return {"samples": len(samples), "replicas": len(replicas),
            "queued_tokens_mean": {r: round(v) for r, v in sorted(queued.items())},
            "outstanding_tokens_mean": {r: round(v) for r, v in sorted(outstanding.items())},
            "items_scored": {r: round(v) for r, v in sorted(items.items())},
            "imbalance_queued_tokens": imbalance(queued),
            "imbalance_outstanding_tokens": imbalance(outstanding),
            "imbalance_items": imbalance(items),
            # per sample, each replica's queued tokens: the queue depth over time
            "queued_tokens_timeline": [{r: round(s.queued_by_replica[r]) for r in sorted(replicas)}
                                       for s in samples]}
