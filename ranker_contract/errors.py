"""Errors a scorer replica raises to its callers. No torch here: the ingress imports this."""

from __future__ import annotations


class ScorerOverloaded(Exception):
    """The replica's queue holds more tokens than it may: the request was not queued."""

    def __init__(self, queued_tokens: int, limit: int, retry_after_s: int = 1) -> None:
        # All fields in args: pickling (Ray sends the exception to the caller) rebuilds from them.
        super().__init__(queued_tokens, limit, retry_after_s)
        self.queued_tokens = queued_tokens
        self.limit = limit
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return f"{self.queued_tokens} tokens already queued (limit {self.limit})"
