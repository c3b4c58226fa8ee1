"""Prometheus metrics of an ingress replica (ray.serve.metrics adds application/deployment/replica).

Every counter series for a label value known in advance exists from start-up, at 0
(ranker_contract/metrics.py says why).
"""

from __future__ import annotations

from collections.abc import Iterable

from ray.serve.metrics import Counter, Histogram

from ranker_contract.metrics import declare_at_zero
from serve_app.auth import NO_KEY
from serve_app.protocol import ApiError
from serve_app.routes import ROUTES

# Fine below 50 ms (a lone request), up to 120 s at the top (a timed-out one) so P99 under load
# never falls into an open-ended bucket.
LATENCY_BUCKETS_MS = [2, 4, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 75, 100, 150, 200, 300, 500,
                      750, 1000, 2000, 5000, 10000, 30000, 60000, 120000]
TOKENIZE_BUCKETS_MS = [0.1, 0.5, 1, 2, 5, 10, 20, 50, 100, 500, 1000, 5000]

# The caller went away before the answer, or its deadline passed (the ingress answers 408 itself,
# serve_app/deadline.py; a request still in Serve's hands gets Serve's 408). A cancellation does
# not say which, so all count as one status and type: the status of a timeout.
CANCELLED_STATUS = 408
CANCELLED_TYPE = "Cancelled"
# Every error a route answers: the ApiError statuses the ingress raises, and the cancellation.
ERRORS = tuple((str(status), ApiError(status, "").kind)
               for status in (400, 401, 404, 413, 429, 500, 503)) + (
    (str(CANCELLED_STATUS), CANCELLED_TYPE),)
# The `model` label of a request answered before its model was known (unreadable JSON, an
# unknown name, no API key): a name the caller made up must not become a label value.
NO_MODEL = "-"


class IngressMetrics:
    """`key_ids`: the `key` label values known at start-up (serve_app/auth.py: the API key ids
    and REFUSED_KEY, or NO_KEY alone while auth is off). `models`: the names a request's `model`
    may pick (AppConfig.model_names), each a `model` label value beside NO_MODEL."""

    def __init__(self, key_ids: Iterable[str] = (NO_KEY,), models: Iterable[str] = ()) -> None:
        self.latency_ms = Histogram("ranker_request_latency_ms", "POST /v1/score, /v1/rerank and "
                                    "/v2/rerank latency in the ingress, by route, HTTP status "
                                    "and model", boundaries=LATENCY_BUCKETS_MS,
                                    tag_keys=("status", "route", "model"))
        self.tokenize_ms = Histogram("ranker_tokenize_ms", "Tokenizing one request's text",
                                     boundaries=TOKENIZE_BUCKETS_MS)
        self.requests = Counter("ranker_requests", "Requests answered, by route, HTTP status, "
                                "API key id and model",
                                tag_keys=("status", "route", "key", "model"))
        self.errors = Counter("ranker_errors", "Failed requests, by error type, status, route, "
                              "API key id and model",
                              tag_keys=("error_type", "status", "route", "key", "model"))
        self.items = Counter("ranker_items", "Items (rerank: document chunks) answered with "
                             "200, by route and model", tag_keys=("route", "model"))
        # What each key used (docs/OPERATIONS.md, "Quotas"): its refusals are in `errors`.
        self.key_items = Counter("ranker_key_items", "Items answered with 200, by API key id "
                                 "and model", tag_keys=("key", "model"))
        self.key_tokens = Counter("ranker_key_tokens", "Tokens scored (the responses' usage) "
                                  "with 200, by API key id and model", tag_keys=("key", "model"))
        self.retries = Counter("ranker_scorer_retries", "Scoring calls sent again to another "
                               "replica because the first replica was lost")
        self.models = (*models, NO_MODEL)
        self._declared: set[str] = set()
        self.declare_keys(key_ids)
        declare_at_zero(self.retries)
        for route in ROUTES:
            for model in models:
                declare_at_zero(self.items, {"route": route, "model": model})

    def declare_keys(self, key_ids: Iterable[str]) -> None:
        """The series of every key id not declared yet, at 0 (also a reloaded key file's)."""
        for key in sorted(set(key_ids) - self._declared):
            for route in ROUTES:
                for model in self.models:
                    tags = {"route": route, "key": key, "model": model}
                    declare_at_zero(self.requests, {"status": "200", **tags})
                    for status, error_type in ERRORS:
                        declare_at_zero(self.requests, {"status": status, **tags})
                        declare_at_zero(self.errors, {"error_type": error_type,
                                                      "status": status, **tags})
            for model in self.models:
                declare_at_zero(self.key_items, {"key": key, "model": model})
                declare_at_zero(self.key_tokens, {"key": key, "model": model})
            self._declared.add(key)

    def answered(self, route: str, status: int, seconds: float,
                 error_type: str | None = None, key: str = NO_KEY, model: str = NO_MODEL,
                 items: int = 0, tokens: int = 0) -> None:
        """One request of `route` from API key id `key` for `model` finished with `status`
        (`error_type` when it failed; `items` answered and `tokens` scored when it did not)."""
        tags = {"status": str(status), "route": route, "model": model}
        self.requests.inc(tags={**tags, "key": key})
        if error_type is not None:
            self.errors.inc(tags={"error_type": error_type, **tags, "key": key})
        elif items:
            self.items.inc(items, tags={"route": route, "model": model})
            self.key_items.inc(items, tags={"key": key, "model": model})
            self.key_tokens.inc(tokens, tags={"key": key, "model": model})
        self.latency_ms.observe(seconds * 1e3, tags=tags)
