"""What the ingress's and the scorer's Prometheus metrics share.

Every counter series for a label value known in advance exists from start-up, at 0
(`declare_at_zero`): Prometheus's rate() and increase() take a series' first sample as its
baseline, so a series born at its first increment would never show that increment.
"""

from __future__ import annotations


def declare_at_zero(counter, tags: dict[str, str] | None = None) -> None:
    """Create the series `tags` of `counter` (a ray.serve.metrics.Counter) with the value 0.

    NOTE: Counter.inc(0) raises (ray.util.metrics.Counter.inc allows only values > 0), but
    inc() itself ends in Metric._record(value, tags), which merges the default tags (replica,
    deployment, application), checks the tag keys and adds `value` to the OpenTelemetry counter;
    adding 0 there exports the series at 0 (checked by tools/check_dashboard.py).
    """
    counter._record(0, tags=tags)
