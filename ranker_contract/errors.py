"""What a scorer replica answers instead of scores. No torch here: the ingress imports this."""

from __future__ import annotations


class ScorerOverloaded(Exception):
    """The scorer refused the job (its token queue was full) or gave up on it (it waited in the
    queue past the configured bound); nothing of it was computed. The ingress answers 503 with
    Retry-After.

    NOTE: a replica returns this as a value rather than raising it across Ray: Serve logs every
    exception that leaves a replica with its traceback, a cost the service should not pay for
    each refusal just when it is full.
    """

    def __init__(self, reason: str, retry_after_s: int = 1) -> None:
        # All fields in args: pickling (Ray sends it to the caller) rebuilds from them.
        super().__init__(reason, retry_after_s)
        self.reason = reason
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return self.reason
