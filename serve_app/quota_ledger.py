"""The quota ledger (docs/OPERATIONS.md, "Quotas"): one Serve replica that every ingress replica
asks before a request of a key with a quota is scored (serve_app/quotas.py, Quotas).

One replica, so that the count is exact across ingress replicas and nodes; it lives as long as
the application, so an ingress replica's restart keeps every key's use. If the ledger itself
is lost, Serve starts it again empty: every key then has its whole minute again (it fails
open, as a rate limiter that must not take the service down with it). Its calls are cheap
(a dictionary update) and come only from admitted requests, their refunds and the first
refusal of a key per wait (docs/ARCHITECTURE.md, "API keys"), so one replica keeps up with the
cluster.
"""

from __future__ import annotations

from ray import serve

from serve_app.quotas import Quota, QuotaWindows, Taken


@serve.deployment(num_replicas=1, max_ongoing_requests=1000,
                  ray_actor_options={"num_cpus": 0})
class QuotaLedger:
    def __init__(self) -> None:
        self.windows = QuotaWindows()

    def take(self, key_id: str, quota: Quota, tokens: int) -> Taken:
        # The caller's quota, not one kept here: a reloaded key file reaches the ledger with
        # the next request of that key.
        return self.windows.take(key_id, quota, tokens)

    def refund(self, key_id: str, quota: Quota, tokens: int, second: int) -> None:
        self.windows.refund(key_id, quota, tokens, second)

    def usage(self, key_id: str, quota: Quota) -> dict:
        return self.windows.usage(key_id, quota)
