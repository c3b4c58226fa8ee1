"""Prometheus metrics of an ingress replica (ray.serve.metrics adds application/deployment/replica)."""

from __future__ import annotations

from ray.serve.metrics import Counter, Histogram

# Fine below 50 ms (a lone request), up to 120 s at the top (a timed-out one) so P99 under load
# never falls into an open-ended bucket.
LATENCY_BUCKETS_MS = [2, 4, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 75, 100, 150, 200, 300, 500,
                      750, 1000, 2000, 5000, 10000, 30000, 60000, 120000]
TOKENIZE_BUCKETS_MS = [0.1, 0.5, 1, 2, 5, 10, 20, 50, 100, 500, 1000, 5000]


class IngressMetrics:
    def __init__(self) -> None:
        self.latency_ms = Histogram("ranker_request_latency_ms", "POST /v1/score, /v1/rerank and "
                                    "/v2/rerank latency in the ingress, by route and HTTP status",
                                    boundaries=LATENCY_BUCKETS_MS, tag_keys=("status", "route"))
        self.tokenize_ms = Histogram("ranker_tokenize_ms", "Tokenizing one request's text",
                                     boundaries=TOKENIZE_BUCKETS_MS)
        self.errors = Counter("ranker_errors", "Failed requests, by error type, status and route",
                              tag_keys=("error_type", "status", "route"))
        self.retries = Counter("ranker_scorer_retries", "Scoring calls sent again to another "
                               "replica because the first replica was lost")
