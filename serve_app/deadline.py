"""A request's deadline, answered by the ingress in the API's error envelope (docs/API.md,
"Errors").

Serve gives up on a request after `http_options.request_timeout_s`, or after the value of the
`x-request-timeout-seconds` header (0 or less: never), and then answers a plain-text 408 of its
own. The ingress keeps the same deadline less a margin and answers first: a JSON 408 that says
how to ask for more time. Its job's futures are cancelled on the way out, so the scorer drops
the sequences still queued (gpu_worker/serving/scheduler.py).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

TIMEOUT_HEADER = "x-request-timeout-seconds"  # Serve's own header
# answer this much before Serve would: the smaller of a second and a tenth of the deadline
MARGIN_S, MARGIN_SHARE = 1.0, 0.1


def serve_timeout_s() -> float | None:
    """Serve's `http_options.request_timeout_s` as its controller holds it (None: none set, or
    not readable, when only Serve's own 408 comes)."""
    import ray

    if not ray.is_initialized():  # not in a replica (tests): no controller to ask
        return None
    try:
        from ray.serve.context import _get_global_client  # the same client serve.status() uses

        timeout = _get_global_client().http_config.request_timeout_s
    except Exception:  # noqa: BLE001 - without it, Serve's deadline alone holds
        logger.warning("could not read Serve's request_timeout_s", exc_info=True)
        return None
    return timeout if timeout and timeout > 0 else None


def request_timeout_s(header: str | None, default_s: float | None) -> float | None:
    """The deadline Serve applies to a request with this header value: the header's when it is a
    positive number, none when it is 0 or less, `default_s` when absent or not a number."""
    if header is None:
        return default_s
    try:
        value = float(header)
    except ValueError:
        return default_s
    return value if value > 0 else None


def answer_by_s(timeout_s: float) -> float:
    """When the ingress answers a request whose deadline is `timeout_s`: before Serve does."""
    return timeout_s - min(MARGIN_S, MARGIN_SHARE * timeout_s)
