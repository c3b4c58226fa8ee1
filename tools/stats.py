"""Percentiles and per-rate aggregation for the load generator (pure functions, no I/O)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

OK = "ok"
# A request sent within this of its scheduled time counts as on time (`on_time_share`).
ON_TIME_S = 0.010
# The client is behind its schedule (`behind_schedule`, "CLIENT BEHIND") when its p99 send lag
# passes both this and the mean gap between two sends: see `client_behind`.
BEHIND_LAG_S = 0.100


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request. Times are seconds from the start of the run.

    intended: scheduled send time; sent: when it was actually handed to the client;
    done: when the response was read (or the error seen); kind: "ok", an HTTP status code as a
    string ("503"), "timeout", "connection", "bad_response" or "client_error"; stages: the
    response's Server-Timing durations in ms by name (serve_app/ingress.py), None without one.
    """

    intended: float
    sent: float
    done: float
    kind: str
    stages: dict[str, float] | None = None


def parse_server_timing(header: str | None) -> dict[str, float] | None:
    """`name;dur=1.23, other;dur=4` -> {"name": 1.23, "other": 4.0}; None when absent."""
    if not header:
        return None
    stages = {}
    for entry in header.split(","):
        name, _, params = entry.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur":
                try:
                    stages[name] = float(value)
                except ValueError:
                    pass
    return stages or None


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile: the smallest value with at least p% of values at or below it.

    Always one of the observed values (never interpolated); p=100 is the max. None if empty.
    """
    if not 0 < p <= 100:
        raise ValueError(f"p must be in (0, 100], got {p}")
    if not values:
        return None
    ordered = sorted(values)
    rank = math.ceil(p / 100 * len(ordered) - 1e-9)  # guard 99/100*100 -> 99.00000000000001
    return ordered[max(rank, 1) - 1]


def summarize_ms(values_s: Iterable[float], pcts: Sequence[float] = (50, 90, 99)) -> dict:
    """{"p50", "p90", "p99", "max", "mean"} in milliseconds of durations given in seconds."""
    ms = sorted(v * 1000.0 for v in values_s)
    out = {f"p{p:g}": _round(percentile(ms, p)) for p in pcts}
    out["max"] = _round(ms[-1] if ms else None)
    out["mean"] = _round(sum(ms) / len(ms) if ms else None)
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def aggregate(outcomes: Sequence[Outcome], *, warmup_s: float, duration_s: float,
              items_per_request: int, offered_rps: float) -> dict:
    """Stats of one offered rate.

    Measured requests are those *scheduled* in the window [warmup_s, warmup_s + duration_s);
    warm-up requests are sent but left out. Latency counts from the scheduled send time (so
    client-side lag is not hidden) to the end of the response, over measured successes.
    achieved_rps is the number of successful responses that *completed* inside the window,
    whatever their send time, divided by the window: the throughput actually delivered.
    """
    end = warmup_s + duration_s
    measured = [o for o in outcomes if warmup_s <= o.intended < end]
    ok = [o for o in measured if o.kind == OK]
    failures = Counter(o.kind for o in measured if o.kind != OK)
    completed = sum(1 for o in outcomes if o.kind == OK and warmup_s <= o.done < end)
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    return {
        "offered_rps": round(offered_rps, 4),
        "offered_items_per_s": round(offered_rps * items_per_request, 3),
        "scheduled_rps": round(len(measured) * per_s, 4),  # this draw of the arrival process
        "achieved_rps": round(completed * per_s, 4),
        "achieved_items_per_s": round(completed * per_s * items_per_request, 3),
        "window_s": duration_s,
        "sent": len(outcomes),
        "warmup_requests": sum(1 for o in outcomes if o.intended < warmup_s),
        "measured_requests": len(measured),
        "successes": len(ok),
        "failed": sum(failures.values()),
        "failures": dict(sorted(failures.items())),
        "latency_ms": summarize_ms(o.done - o.intended for o in ok),
        # How fast the excess is turned away: 503s from scheduled send to the answer.
        "refusal_latency_ms": summarize_ms(o.done - o.intended for o in measured
                                           if o.kind == "503"),
        "send_lag_ms": summarize_ms((o.sent - o.intended for o in measured), pcts=(50, 99)),
        **schedule_keeping(measured, offered_rps),
        **where_time_went(ok),
    }


def schedule_keeping(measured: Sequence[Outcome], rate: float) -> dict:
    """Did the client keep its schedule: the share of requests sent within ON_TIME_S of their
    scheduled time, and whether it fell behind (`client_behind`) at the offered `rate`."""
    on_time = sum(1 for o in measured if o.sent - o.intended <= ON_TIME_S)
    share = on_time / len(measured) if measured else None
    return {"on_time_share": _round(share),
            "behind_schedule": client_behind([o.sent - o.intended for o in measured], rate)}


def client_behind(send_lags_s: Sequence[float], rate: float) -> bool:
    """True when the client could not keep up with `rate` requests/s: the p99 of its send lags
    (seconds) is over BEHIND_LAG_S and over the mean gap between two sends (1 / rate).

    Lags of a few to tens of ms are the jitter of a busy event loop, at any rate; a share of
    requests past a small lag would flag them whenever a low rate sends few requests and one
    is a little late. A client out of capacity leaves each request unsent when the next is
    due, so its lag grows through the run past both bounds: the backlog that more client
    processes (--clients) clear. A lag shorter than the gap is no backlog, and more processes
    would not shorten it."""
    p99 = percentile(send_lags_s, 99)
    return p99 is not None and p99 > BEHIND_LAG_S and p99 > (1.0 / rate if rate > 0 else 0.0)


def where_time_went(ok: Sequence[Outcome]) -> dict:
    """Per Server-Timing stage, its p50/p99/mean over the successes that carry one; `outside`
    is the client's latency minus the ingress's own time: the front door, the network and the
    client itself."""
    timed = [o for o in ok if o.stages]
    names = sorted({name for o in timed for name in o.stages})
    stages = {name: summarize_ms((o.stages[name] / 1e3 for o in timed if name in o.stages),
                                 pcts=(50, 99)) for name in names}
    if timed and "ingress" in names:
        stages["outside"] = summarize_ms(
            (max(0.0, o.done - o.intended - o.stages["ingress"] / 1e3) for o in timed
             if "ingress" in o.stages), pcts=(50, 99))
    return {"stages_ms": stages}


def passes(point: dict, p99_bound_ms: float) -> bool:
    """A point counts when it has successes, no failures, and P99 latency within the bound."""
    p99 = point["latency_ms"]["p99"]
    return point["successes"] > 0 and point["failed"] == 0 and p99 is not None \
        and p99 <= p99_bound_ms


def pick_best(points: Sequence[dict], p99_bound_ms: float) -> dict | None:
    """The passing point with the highest achieved items/s (None if no point passes)."""
    good = [p for p in points if passes(p, p99_bound_ms)]
    return max(good, key=lambda p: p["achieved_items_per_s"]) if good else None
