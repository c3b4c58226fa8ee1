"""Autoscaling policy for ScoreWorker: scale on the tokens waiting and running, not on requests.

Configured in the YAML as `autoscaling_config.policy`:

    policy_function: ranker_app.autoscaling_policy:QueueDepthPolicy
    policy_kwargs: {target_tokens_per_replica: 65536}

Each replica reports its queue depth and the tokens it refused per second (admission or the
queue-wait bound) through `record_autoscaling_stats`; Serve averages every
replica's values over `look_back_period_s` and calls this policy on its controller about ten times
a second. The policy returns the raw replica count; Serve then applies min/max_replicas and
upscale_delay_s / downscale_delay_s (short and long: fast up, slow down).

Standard library only: Serve pickles the policy by value and runs it on the controller.
"""

from __future__ import annotations

import math
from typing import Any


# Refused demand counts as this many seconds of queue: what one more replica would have to take.
REFUSED_WINDOW_S = 1.0


class QueueDepthPolicy:
    """desired replicas = ceil(Σ over replicas of (queued + inflight tokens + refused tokens/s ×
    REFUSED_WINDOW_S) / target): shedding the excess must not hide it from the autoscaler."""

    def __init__(self, target_tokens_per_replica: float) -> None:
        if not target_tokens_per_replica > 0:
            raise ValueError("target_tokens_per_replica must be > 0")
        self.target = float(target_tokens_per_replica)

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        metrics = ctx.aggregated_metrics or {}
        queued = metrics.get("queued_tokens") or {}
        inflight = metrics.get("inflight_tokens") or {}
        if not queued and not inflight:
            # No replica has reported yet (a fresh deployment): hold the current target.
            return ctx.target_num_replicas, {"tokens": None}
        refused = sum((metrics.get("refused_tokens_per_s") or {}).values()) * REFUSED_WINDOW_S
        tokens = sum(queued.values()) + sum(inflight.values()) + refused
        return math.ceil(tokens / self.target), {"tokens": tokens, "refused_tokens": refused}
