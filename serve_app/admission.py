"""Admission before work, sized from the scorer replicas that are running (docs/ARCHITECTURE.md,
"Admission").

Each ingress replica admits at most ceil(requests_per_scorer × running scorers ÷ running ingress
replicas) requests at a time; one more is answered 503 before its body is read. The service as a
whole so admits about `requests_per_scorer` per scorer that can take work: when the autoscaler
adds a scorer, every ingress replica admits more within a second of it RUNNING, with no
redeploy, and while it starts the running ones are not handed its share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class ReplicaCounts:
    """RUNNING replicas of both deployments, as Serve's controller last said (serve_app/ingress.py,
    ScorerWatch). Until it has said, one of each."""

    scorers: int = 1
    ingresses: int = 1


class Admission:
    def __init__(self, requests_per_scorer: int, counts: ReplicaCounts) -> None:
        self.requests_per_scorer = requests_per_scorer
        self.counts = counts
        self.inflight = 0

    def limit(self) -> int:
        """Requests this ingress replica may hold now: at least one, so a service whose scorers
        are all gone still lets a request reach the scorer check (its 503 names the cause)."""
        share = self.requests_per_scorer * self.counts.scorers / max(1, self.counts.ingresses)
        return max(1, math.ceil(share))

    def try_enter(self) -> bool:
        if self.inflight >= self.limit():
            return False
        self.inflight += 1
        return True

    def leave(self) -> None:
        self.inflight -= 1
