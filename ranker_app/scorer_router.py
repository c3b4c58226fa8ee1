"""Request routing to the scorer replicas (docs/ARCHITECTURE.md, "Routing").

Every ingress replica routes its own jobs by outstanding tokens: per scorer replica, the tokens
of the jobs this router sent there that have not been answered yet. A job goes to the replica
with the fewest (ties at random); the others follow as fallbacks in that order. Each ingress
replica splits its own stream evenly by work, so their sum is even too: the scorers stay within
about one job per ingress replica of each other, with no shared state and no extra call per job.
Serve's default router picks the shorter queue of two random replicas by request count, as each
router's cache last heard it; with two scorers it left one with more queued work (measured:
docs/BENCHMARKS.md, "Two GPUs").

Prefix affinity (the prefix cache on): a job whose query a scorer would cache carries
`ScoreJob.prefix_key`. The replicas are ranked for that key by rendezvous hashing (the same order
in every process), so repeats of a query reach the replica that holds its K/V. A load bound keeps
a hot query from pinning one replica: the first replica in that order whose outstanding tokens,
with this job, stay within max(SPILL_FACTOR × mean, mean + SPILL_SLACK_JOBS × this job) takes it;
the others follow by outstanding tokens. Replicas that come or go move only the keys they own.

Adapter affinity (LoRA adapters, docs/API.md "Several rankers"): a job of an adapter is ranked
the same way on the adapter's number, so each adapter has a home replica that loads it and
keeps it in one of its slots, the replicas between them holding `lora.slots` × replicas
adapters; under load the bound spills it to others, which load it too.

Model affinity (the full models of `models`, loaded through Serve's model multiplexing): a job
of one is ranked the same way on the model's name, with the replicas that hold it (or are
loading it, as each replica tells Serve) ahead of the others in that order, and of those the
ones holding fewer models first: a model has a home replica, keeps it when replicas come or go,
loads where it displaces least, and elsewhere too only past the load bound.

Runs inside each ingress replica (Serve calls it in the caller of the scorer's handle); set on
the scorer deployment by ranker_app/app.py.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

SPILL_FACTOR = 1.25
SPILL_SLACK_JOBS = 2
# A charge made when a replica is chosen and never confirmed as sent (the request was cancelled
# while it waited to be routed) is dropped after this long.
UNCONFIRMED_TTL_S = 5.0


def affinity(key: str, replica: str) -> int:
    """Rendezvous weight of `replica` (its unique id) for `key`: the highest weight owns it."""
    return int.from_bytes(hashlib.blake2b(f"{key}:{replica}".encode(), digest_size=8).digest())


def by_outstanding(outstanding: dict[str, int]) -> list[str]:
    """Replica ids (keys of `outstanding`: their outstanding tokens), fewest first, ties at
    random."""
    return sorted(outstanding, key=lambda replica: (outstanding[replica], random.random()))


def rank_for_key(key: str, outstanding: dict[str, int], tokens: int,
                 models: dict[str, frozenset[str]] | None = None,
                 model: str | None = None) -> list[str]:
    """Replica ids in the order to try for a job of `tokens` with prefix `key`: the first within
    the load bound in hash order, then the others by outstanding tokens. A job of `model` (one
    of `models`) ranks by `models` (replica id -> the models it holds) first: the replicas
    holding it, then those holding fewer models."""
    mean = (sum(outstanding.values()) + tokens) / len(outstanding)  # with this job
    bound = max(SPILL_FACTOR * mean, mean + SPILL_SLACK_JOBS * tokens)

    def order(replica: str):
        held = models.get(replica, frozenset()) if models and model else frozenset()
        return model in held, -len(held), affinity(key, replica)

    for replica in sorted(outstanding, key=order, reverse=True):
        if outstanding[replica] + tokens <= bound:
            return [replica, *(r for r in by_outstanding(outstanding) if r != replica)]
    return by_outstanding(outstanding)


def job_tokens(job) -> int:
    return sum(s.num_tokens for s in getattr(job, "sequences", ()))


def job_of(pending_request: PendingRequest | None):
    """The ScoreJob of a call to the scorer's `score`, else None."""
    return pending_request.args[0] if pending_request is not None and pending_request.args else None


def affinity_key(job) -> str | None:
    """The job's prefix key, else its adapter's or its model's; None for a job of model_path's
    model without one."""
    if getattr(job, "prefix_key", None) is not None:
        return job.prefix_key
    if getattr(job, "model", None) is not None:
        return f"model {job.model}"
    adapter = getattr(job, "adapter", 0)
    return f"adapter {adapter}" if adapter else None


@dataclass
class Charge:
    replica: ReplicaID
    tokens: int
    sent: bool  # confirmed by Serve (on_request_routed); else chosen, not yet sent
    at: float


class ScorerRouter(RequestRouter):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._charges: dict[str, Charge] = {}  # by Serve's internal request id

    def outstanding(self) -> dict[ReplicaID, int]:
        totals: dict[ReplicaID, int] = {}
        for charge in self._charges.values():
            totals[charge.replica] = totals.get(charge.replica, 0) + charge.tokens
        return totals

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is not None:
            # When every tier refused, wait before asking again (no busy loop).
            pending_request.routing_context.should_backoff = True
        self._drop_unconfirmed(time.monotonic() - UNCONFIRMED_TTL_S)
        totals = self.outstanding()
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        outstanding = {unique_id: totals.get(r.replica_id, 0) for unique_id, r in by_id.items()}
        job = job_of(pending_request)
        tokens, key, model = job_tokens(job), affinity_key(job), getattr(job, "model", None)
        models = ({unique_id: frozenset(r.multiplexed_model_ids) for unique_id, r in by_id.items()}
                  if model is not None else None)
        order = (rank_for_key(key, outstanding, tokens, models, model) if key is not None
                 else by_outstanding(outstanding))
        if pending_request is not None:  # counted at once: the next choice must see it
            self._charge(pending_request, by_id[order[0]].replica_id, tokens, sent=False)
        return [[by_id[unique_id]] for unique_id in order]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result) -> None:
        super().on_request_routed(pending_request, replica_id, result)
        self._charge(pending_request, replica_id, job_tokens(job_of(pending_request)), sent=True)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        self._charges.pop(internal_request_id, None)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        for request_id in [i for i, c in self._charges.items() if c.replica not in live]:
            del self._charges[request_id]

    def _charge(self, pending_request: PendingRequest, replica: ReplicaID, tokens: int,
                sent: bool) -> None:
        self._charges[pending_request.metadata.internal_request_id] = Charge(
            replica, tokens, sent, time.monotonic())

    def _drop_unconfirmed(self, before: float) -> None:
        for request_id in [i for i, c in self._charges.items() if not c.sent and c.at < before]:
            del self._charges[request_id]
