"""Autoscaling policy for ScoreWorker: scale on the tokens waiting and running, and on the tokens
computed against each replica's measured capacity; not on requests.

Configured in the YAML as `autoscaling_config.policy`:

    policy_function: ranker_app.autoscaling_policy:ScorerLoadPolicy
    policy_kwargs: {target_tokens_per_replica: 65536, target_demand_share: 0.7}

Each replica reports its queue depth, the tokens it refused per second (admission or the
queue-wait bound) and the tokens it computed per second as a share of its capacity (measured at
warm-up on an ~8k-token batch), through
`record_autoscaling_stats`; Serve averages every replica's values over `look_back_period_s` and
calls this policy on its controller about ten times a second. The policy returns the raw replica
count; Serve then applies min/max_replicas and upscale_delay_s / downscale_delay_s (short and
long: fast up, slow down).

Why both signals: tokens in the service only grow once a replica is saturated, so on a rising
load a replica added on them starts (12–20 s on a GPU) while the excess is already being refused.
The demand share rises with the load before that, so a replica is added while the first still
keeps up (docs/ARCHITECTURE.md, "Autoscaling").

Standard library only: Serve pickles the policy by value and runs it on the controller.
"""

from __future__ import annotations

import math
from typing import Any

# Refused demand counts as this many seconds of queue: what one more replica would have to take.
REFUSED_WINDOW_S = 1.0


class ScorerLoadPolicy:
    """desired replicas = the larger of
    ceil(Σ over replicas of (queued + inflight tokens + refused tokens/s × REFUSED_WINDOW_S)
    / target_tokens_per_replica) (shedding the excess must not hide it from the autoscaler) and,
    when target_demand_share > 0, ceil(Σ demand shares / target_demand_share)."""

    def __init__(self, target_tokens_per_replica: float, target_demand_share: float = 0.0) -> None:
        if not target_tokens_per_replica > 0:
            raise ValueError("target_tokens_per_replica must be > 0")
        if not 0 <= target_demand_share <= 1:
            raise ValueError("target_demand_share must be in [0, 1] (0: off)")
        self.target = float(target_tokens_per_replica)
        self.target_demand = float(target_demand_share)

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        metrics = ctx.aggregated_metrics or {}
        queued = metrics.get("queued_tokens") or {}
        inflight = metrics.get("inflight_tokens") or {}
        if not queued and not inflight:
            # No replica has reported yet (a fresh deployment): hold the current target.
            return ctx.target_num_replicas, {"tokens": None}
        refused = sum((metrics.get("refused_tokens_per_s") or {}).values()) * REFUSED_WINDOW_S
        tokens = sum(queued.values()) + sum(inflight.values()) + refused
        desired = math.ceil(tokens / self.target)
        demand = sum((metrics.get("demand_share") or {}).values())
        if self.target_demand > 0:
            desired = max(desired, math.ceil(demand / self.target_demand))
        return desired, {"tokens": tokens, "refused_tokens": refused, "demand_share": demand}
