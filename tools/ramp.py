"""Load ramp with a timeline: offered rate in phases, and once a second the client's view
(completions, failures, P99) beside the service's (scorer replicas, queued tokens) from Prometheus.

Usage: python -m tools.ramp --url http://127.0.0.1:8000 --phases 20:5,60:40,90:5
       [--metrics-url auto] [--query-len 40 --items 4 --item-len 40 --vocab 49152 --text natural]
       [--out docs/results/ramp.json] [--plot docs/results/ramp.png]

`--phases` is DURATION_S:RATE,...; arrivals are Poisson, sent open-loop (tools/http_client.py).
`--metrics-url auto` reads the port of the newest local Ray session. Plot afterwards with
`python -m tools.plot ramp.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tools import RESULTS_DIR
from tools.cli_args import add_workload_args, workload_from_args
from tools.http_client import make_session, send_schedule
from tools.prom import ServiceSample, find_metrics_url, scrape, service_sample
from tools.stats import OK, Outcome, percentile
from tools.workload import RequestFactory, Workload, arrival_offsets


@dataclass(frozen=True)
class Phase:
    duration_s: float
    rate: float


def parse_phases(text: str) -> list[Phase]:
    phases = []
    for part in text.split(","):
        duration, rate = part.split(":")
        phases.append(Phase(float(duration), float(rate)))
    if not phases or any(p.duration_s <= 0 or p.rate <= 0 for p in phases):
        raise ValueError("phases must be DURATION_S:RATE,... with positive numbers")
    return phases


def schedule(phases: list[Phase], seed: int | str = 0) -> list[float]:
    """Poisson send times over all phases, in seconds from the start."""
    out, start = [], 0.0
    for i, phase in enumerate(phases):
        out += [start + t for t in arrival_offsets("poisson", phase.rate, phase.duration_s,
                                                    f"{seed}:{i}")]
        start += phase.duration_s
    return out


@dataclass
class Tick:
    """One sample of the service, `t` seconds from the start."""

    t: float
    service: ServiceSample | None  # None when the metrics could not be read


async def run_ramp(base_url: str, workload: Workload, phases: list[Phase], *,
                   metrics_url: str | None = None, sample_every_s: float = 1.0,
                   timeout_s: float = 60.0, seed: int | str = 0,
                   on_tick=None) -> tuple[list[Outcome], list[Tick]]:
    """Send the ramp open-loop and sample metrics meanwhile; `on_tick(tick)` sees each sample."""
    loop = asyncio.get_running_loop()
    ticks: list[Tick] = []
    finished = asyncio.Event()

    async def sampler() -> None:
        while not finished.is_set():
            service = None
            if metrics_url:
                try:
                    service = service_sample(await asyncio.to_thread(scrape, metrics_url))
                except OSError:
                    pass
            tick = Tick(round(loop.time() - t0, 3), service)
            ticks.append(tick)
            if on_tick:
                on_tick(tick)
            try:
                await asyncio.wait_for(finished.wait(), sample_every_s)
            except TimeoutError:
                pass

    async with make_session() as session:
        t0 = loop.time()  # one origin for send times and samples
        sampling = asyncio.create_task(sampler())
        outcomes = await send_schedule(session, base_url, schedule(phases, seed),
                                       RequestFactory(workload, seed), timeout_s=timeout_s,
                                       start=t0)
        finished.set()
        await sampling
    return outcomes, ticks


def timeline(outcomes: list[Outcome], ticks: list[Tick], phases: list[Phase],
             window_s: float = 1.0) -> list[dict]:
    """Per window: offered rate, completions, failures, P99 of requests sent in it, and the
    service's state (replicas serving = items counter grew since the previous sample)."""
    horizon = sum(p.duration_s for p in phases)
    windows = int(horizon / window_s) + 1
    sent_in: list[list[Outcome]] = [[] for _ in range(windows)]  # by send time
    ok_done_in = [0] * windows  # successes by completion time
    for o in outcomes:
        if 0 <= o.intended < windows * window_s:
            sent_in[int(o.intended // window_s)].append(o)
        if o.kind == OK and 0 <= o.done < windows * window_s:
            ok_done_in[int(o.done // window_s)] += 1
    rows = []
    prev_items: dict[str, float] = {}
    tick_i = 0
    for w in range(windows):
        lo, hi = w * window_s, (w + 1) * window_s
        sent = sent_in[w]
        lat = [1e3 * (o.done - o.intended) for o in sent if o.kind == OK]
        row = {
            "t": lo, "offered_rps": _rate_at(phases, lo),
            "sent": len(sent), "ok_completed": ok_done_in[w],
            "failed": sum(1 for o in sent if o.kind != OK),
            "p99_ms": percentile(lat, 99) if lat else None,
        }
        sample = None
        while tick_i < len(ticks) and ticks[tick_i].t < hi:
            sample = ticks[tick_i].service or sample
            tick_i += 1
        if sample is not None:
            serving = sum(1 for r, v in sample.items_scored.items() if v > prev_items.get(r, 0))
            prev_items = dict(sample.items_scored)
            row.update(target_replicas=sample.target_replicas, serving_replicas=serving,
                       queued_tokens=sample.queued_tokens, inflight_tokens=sample.inflight_tokens)
        rows.append(row)
    return rows


def _rate_at(phases: list[Phase], t: float) -> float:
    start = 0.0
    for p in phases:
        if t < start + p.duration_s:
            return p.rate
        start += p.duration_s
    return 0.0


def summarize(outcomes: list[Outcome], rows: list[dict], phases: list[Phase]) -> dict:
    failures: dict[str, int] = {}
    for o in outcomes:
        if o.kind != OK:
            failures[o.kind] = failures.get(o.kind, 0) + 1
    peak = max(phases, key=lambda p: p.rate)
    peak_start = sum(p.duration_s for p in phases[:phases.index(peak)])
    second = next((r["t"] for r in rows if r["t"] >= peak_start
                   and (r.get("serving_replicas") or 0) >= 2), None)
    # Serve's decision (the target first reaches 2) to the second replica's first scored items;
    # 1 s windows, and a window without a Prometheus sample has neither field.
    asked = next((r["t"] for r in rows if (r.get("target_replicas") or 0) >= 2), None)
    serving = next((r["t"] for r in rows if asked is not None and r["t"] >= asked
                    and (r.get("serving_replicas") or 0) >= 2), None)
    return {
        "requests": len(outcomes), "failed": sum(failures.values()), "failures": failures,
        "max_serving_replicas": max((r.get("serving_replicas") or 0 for r in rows), default=0),
        "peak_phase_start_s": peak_start,
        "second_replica_serving_after_s": None if second is None else second - peak_start,
        "second_replica_asked_at_s": asked,
        "scale_up_s": None if serving is None else serving - asked,
        "final_target_replicas": next((r["target_replicas"] for r in reversed(rows)
                                       if r.get("target_replicas") is not None), None),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m tools.ramp", description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--phases", required=True, help="DURATION_S:RATE,...")
    p.add_argument("--metrics-url", default="auto", help="Prometheus URL, 'auto' or 'none'")
    add_workload_args(p, query_len=40, items=4, item_len=40, vocab=49152)
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "ramp.json")
    p.add_argument("--plot", type=Path, default=None)
    args = p.parse_args(argv)
    phases = parse_phases(args.phases)
    workload = workload_from_args(args)
    metrics_url = {"auto": None, "none": ""}.get(args.metrics_url, args.metrics_url)
    if metrics_url is None:
        metrics_url = find_metrics_url()

    def show(tick: Tick) -> None:
        s = tick.service
        if s is not None:
            print(f"t={tick.t:6.1f}s target={s.target_replicas} queued={s.queued_tokens:.0f} "
                  f"inflight={s.inflight_tokens:.0f}", flush=True)

    started = time.time()
    outcomes, ticks = asyncio.run(run_ramp(args.url, workload, phases, metrics_url=metrics_url,
                                           timeout_s=args.timeout_s, on_tick=show))
    rows = timeline(outcomes, ticks, phases)
    result = {"command": "python -m tools.ramp " + " ".join(argv or []), "started": started,
              "url": args.url, "workload": workload.describe(),
              "phases": [asdict(ph) for ph in phases], "summary": summarize(outcomes, rows, phases),
              "timeline": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"]))
    if args.plot:
        from tools.plot import plot_timeline

        plot_timeline(result, args.plot)
    return result


if __name__ == "__main__":
    main()
