"""Errors a scorer replica raises to its callers. No torch here: the ingress imports this."""

from __future__ import annotations


class ScorerOverloaded(Exception):
    """The replica's queue holds more tokens than it may: the request was not queued."""

    def __init__(self, queued_tokens: int, limit: int, retry_after_s: int = 1) -> None:
        super().__init__(f"{queued_tokens} tokens already queued (limit {limit})")
        self.retry_after_s = retry_after_s

    def __reduce__(self):  # keep the fields when Ray pickles the exception to the caller
        return _rebuild, (str(self), self.retry_after_s)


def _rebuild(message: str, retry_after_s: int) -> ScorerOverloaded:
    exc = ScorerOverloaded.__new__(ScorerOverloaded)
    Exception.__init__(exc, message)
    exc.retry_after_s = retry_after_s
    return exc
