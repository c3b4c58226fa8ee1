"""Prefix-affinity request routing to the scorer replicas (docs/ARCHITECTURE.md, "Prefix cache").

A job whose query a scorer would cache carries `ScoreJob.prefix_key`. Every ingress replica
ranks the scorer replicas for that key by rendezvous hashing (the same order in every process,
no shared state), so repeats of a query reach the replica that holds its K/V. The load bound
keeps a hot query from pinning one replica: the first replica in that order whose in-flight
jobs (those this router sent) stay within max(ceil(SPILL_FACTOR * mean), mean + SPILL_SLACK)
takes it; the rest follow in hash order as fallbacks. A job without a key gets Serve's default
treatment: the shorter queue of two random replicas. Replicas that come or go move only the
keys they own; a lost replica loses only its cache.

Runs inside each ingress replica (Serve calls it in the caller of the scorer's handle); set on
the scorer deployment by ranker_app/app.py when the prefix cache is on.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import defaultdict

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

SPILL_FACTOR = 1.25
SPILL_SLACK = 2


def affinity(key: str, replica: str) -> int:
    """Rendezvous weight of `replica` (its unique id) for `key`: the highest weight owns it."""
    return int.from_bytes(hashlib.blake2b(f"{key}:{replica}".encode(), digest_size=8).digest())


def rank_replicas(key: str, inflight: dict[str, int]) -> list[str]:
    """Replica ids (keys of `inflight`, their jobs in flight) in the order to try for `key`:
    those within the load bound in hash order, then the others in hash order."""
    ranked = sorted(inflight, key=lambda replica: affinity(key, replica), reverse=True)
    mean = (sum(inflight.values()) + 1) / len(inflight)  # with this job
    bound = max(math.ceil(SPILL_FACTOR * mean), mean + SPILL_SLACK)
    within = [r for r in ranked if inflight[r] + 1 <= bound]
    return within + [r for r in ranked if r not in within]


def _prefix_key(pending_request: PendingRequest | None) -> str | None:
    if pending_request is None or not pending_request.args:
        return None
    return getattr(pending_request.args[0], "prefix_key", None)  # a ScoreJob


class PrefixAffinityRouter(RequestRouter):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._inflight: defaultdict[ReplicaID, int] = defaultdict(int)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is not None:
            # When every tier refused, wait before asking again (no busy loop).
            pending_request.routing_context.should_backoff = True
        key = _prefix_key(pending_request)
        if key is None or len(candidate_replicas) == 1:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        order = rank_replicas(key, {unique_id: self._inflight[r.replica_id]
                                    for unique_id, r in by_id.items()})
        return [[by_id[unique_id]] for unique_id in order]

    def on_send_request(self, replica_id: ReplicaID) -> None:
        super().on_send_request(replica_id)
        self._inflight[replica_id] += 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        if self._inflight[replica_id] > 0:
            self._inflight[replica_id] -= 1

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        for gone in [r for r in self._inflight if r not in live]:
            del self._inflight[gone]
