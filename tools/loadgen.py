"""Open-loop load generator for POST /v1/score or /v1/rerank (library + CLI).

  python -m tools.loadgen run    --rate 20 [--duration 30 --warmup 5 --arrival poisson]
  python -m tools.loadgen sweep  --rates 5,10,20 | --start-rate 1 --factor 2 --bisect-steps 3
                                    [--p99-ms 500 --plot out.png]
  python -m tools.loadgen overload --capacity-rps 240 [--multiples 1,1.2,1.5,3]
  python -m tools.loadgen single [--requests 200 --items 10 --item-len 300 --query-len 0]
                                 (back-to-back latency and where it goes: Server-Timing stages)
  python -m tools.loadgen sporadic [--rate 2 --requests 60 --items 1 --item-len 180]
                                 (a lone request on an idle service: constant low rate, each
                                  request's idle time before it recorded)
  (any command: [--text repeat|natural] sends strings instead of token ids; with --rerank, to
  /v1/rerank as {query, documents}; [--clients N] spreads the load over N processes, by default
  one per 100 req/s; [--metrics-url auto] adds the scorer replicas' balance to each point)

Open loop: send times are drawn up front (Poisson or constant arrivals at the offered rate) and
each request is sent at its time whatever the state of earlier ones; a response is never awaited
before the next send (`send_schedule` of tools/http_client.py). Requests of the warm-up
period are sent but left out of the stats. Every body carries fresh random token ids (seeded), so
no two requests are alike. Latency runs from the scheduled send time to the end of the response
body; `send_lag_ms` shows how late the client itself was. Stats definitions:
tools/stats.py::aggregate. JSON written by --out:
  {"meta": {...}, "config": {...}, "workload": {...}, "result": point}               (run)
  {..., "p99_bound_ms", "points": [point, ...], "best": point | null, "plot": path}  (sweep)
  {..., "capacity_items_per_s", "p99_at_capacity_ms", "overload": [{"multiple",
   "offered_items_per_s", "goodput_items_per_s", "accepted_p99_ms", "refusal_p99_ms",
   "refused", "other_failures"}, ...], "points": [point, ...]}                     (overload)
  {..., "result": {"requests", "successes", "failed", "failures", "latency_ms",
                   "stages_ms"}}                                                     (single)
  {..., "result": {"requests", "rate", "idle", "busy", "failed", "failures", "latency_ms",
                   "busy_latency_ms", "idle_before_ms", "stages_ms"}}              (sporadic)
where a point is {"offered_rps", "offered_items_per_s", "scheduled_rps", "achieved_rps",
"achieved_items_per_s", "window_s", "sent", "warmup_requests", "measured_requests", "successes",
"failed", "failures": {"503" | "timeout" | "connection" | ...: count}, "latency_ms": {"p50",
"p90", "p99", "max", "mean"}, "refusal_latency_ms": {...} (503s), "send_lag_ms": {...},
"on_time_share", "behind_schedule" (the client fell behind its schedule), "stages_ms": {stage:
{...}} (Server-Timing, + "outside": the time outside the ingress), "client_processes",
"scorers": tools/prom.py::scorer_balance (with --metrics-url)}
(+ "passed" in a sweep, "multiple" in an overload run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import aiohttp
from tqdm import tqdm

from tools import REPO_ROOT, RESULTS_DIR
from tools.cli_args import build_parser, workload_from_args
from tools.client_pool import START_MARGIN_S, run_processes
from tools.http_client import make_session, send_one, send_schedule
from tools.prom import (
    ServiceSample,
    find_metrics_url,
    scorer_balance,
    scrape,
    service_sample,
)
from tools.stats import (
    OK,
    Outcome,
    aggregate,
    passes,
    pick_best,
    summarize_ms,
    where_time_went,
)
from tools.workload import RequestFactory, Workload, arrival_offsets


@dataclass(frozen=True)
class RateConfig:
    """One offered rate: `warmup_s` of arrivals (not measured), then `duration_s` measured."""

    rate: float
    duration_s: float = 30.0
    warmup_s: float = 5.0
    arrival: str = "poisson"
    timeout_s: float = 30.0
    seed: int | str = 0
    # client processes (tools/client_pool.py); 1 = this event loop; 0 = one per CLIENT_RPS
    clients: int = 0
    metrics_url: str | None = None  # Prometheus: the scorer replicas' balance per point


# What one client process offers on time with bench bodies (text ones cost the most to make);
# past it a process falls behind its schedule and its lag counts as latency.
CLIENT_RPS = 100.0
BALANCE_SAMPLE_S = 0.5


def client_processes(cfg: RateConfig) -> int:
    return cfg.clients or max(1, math.ceil(cfg.rate / CLIENT_RPS))


async def run_rate(session: aiohttp.ClientSession, base_url: str, workload: Workload,
                   cfg: RateConfig, *, progress: bool = True) -> tuple[dict, list[Outcome]]:
    """Offer `cfg.rate` requests/s open-loop; returns (stats point, every request's outcome).
    With `cfg.metrics_url`, the point also holds the scorer replicas' balance (`scorers`),
    sampled over the measured window."""
    horizon = cfg.warmup_s + cfg.duration_s
    clients = client_processes(cfg)
    # Client processes start sending START_MARGIN_S after they are launched.
    measured_from = (asyncio.get_running_loop().time() + cfg.warmup_s
                     + (START_MARGIN_S if clients > 1 else 0.0))
    sampling = (asyncio.create_task(sample_balance(cfg.metrics_url, measured_from,
                                                   cfg.duration_s))
                if cfg.metrics_url else None)
    if clients > 1:
        outcomes = await asyncio.to_thread(run_processes, base_url, workload, cfg.rate, horizon,
                                           cfg.arrival, cfg.seed, cfg.timeout_s, clients)
    else:
        offsets = arrival_offsets(cfg.arrival, cfg.rate, horizon, cfg.seed)
        factory = RequestFactory(workload, cfg.seed, cfg.rate)
        outcomes = await send_schedule(session, base_url, offsets, factory,
                                       timeout_s=cfg.timeout_s, desc=f"{cfg.rate:g} req/s",
                                       progress=progress)
    point = aggregate(outcomes, warmup_s=cfg.warmup_s, duration_s=cfg.duration_s,
                      items_per_request=workload.items, offered_rps=cfg.rate)
    point["client_processes"] = clients
    if sampling:
        point["scorers"] = scorer_balance(await sampling)
    return point, outcomes


async def sample_balance(metrics_url: str, measured_from: float,
                         duration_s: float) -> list[ServiceSample]:
    """The scorer replicas' queues, scraped every BALANCE_SAMPLE_S within the measured window
    (`measured_from`, a loop time, for `duration_s`)."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, measured_from - loop.time()))
    samples = []
    while loop.time() < measured_from + duration_s:
        try:
            samples.append(service_sample(await asyncio.to_thread(scrape, metrics_url)))
        except OSError:  # a missed scrape leaves a gap, not a failed run
            pass
        await asyncio.sleep(BALANCE_SAMPLE_S)
    return samples


async def run_closed_loop(session: aiohttp.ClientSession, base_url: str, workload: Workload,
                          concurrency: int, stop: asyncio.Event, *, timeout_s: float = 60.0,
                          seed: int | str = 0) -> list[Outcome]:
    """`concurrency` clients, each sending its next request as soon as the last one answered,
    until `stop` is set. Closed loop: the service holds about `concurrency` requests at any
    time however fast it is, so its queue depth does not depend on the machine's speed."""
    url = base_url.rstrip("/") + workload.path
    factory = RequestFactory(workload, seed)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    outcomes: list[Outcome] = []

    async def client() -> None:
        while not stop.is_set():
            body = factory.next_bytes()
            sent = loop.time() - t0
            kind, stages = await send_one(session, url, body, workload.items, timeout_s,
                                          workload.result_key)
            outcomes.append(Outcome(sent, sent, loop.time() - t0, kind, stages))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    outcomes.sort(key=lambda o: o.intended)
    return outcomes


async def run_sweep(session: aiohttp.ClientSession, base_url: str, workload: Workload,
                    base: RateConfig, p99_bound_ms: float, *, rates: list[float] | None = None,
                    start_rate: float = 1.0, factor: float = 2.0, max_rate: float = 10000.0,
                    bisect_steps: int = 3, cooldown_s: float = 2.0, progress: bool = True,
                    report=print) -> dict:
    """Fixed `rates`, or a ramp: start_rate × factor^k until a point fails (P99 over the bound or
    any failure) or max_rate is passed, then `bisect_steps` bisections between the last passing
    and the first failing rate. Returns {"points": [...], "best": point | None}."""
    points: list[dict] = []

    async def measure(rate: float) -> bool:
        if points and cooldown_s > 0:
            await asyncio.sleep(cooldown_s)  # let the previous point's queue drain
        cfg = replace(base, rate=rate, seed=f"{base.seed}:{len(points)}")
        point, _ = await run_rate(session, base_url, workload, cfg, progress=progress)
        point["passed"] = passes(point, p99_bound_ms)
        points.append(point)
        report(format_point(point))
        return point["passed"]

    if rates:
        for rate in rates:
            await measure(rate)
    else:
        good, bad, rate = None, None, start_rate
        while rate <= max_rate:
            if await measure(rate):
                good, rate = rate, rate * factor
            else:
                bad = rate
                break
        if good is not None and bad is not None:
            for _ in range(bisect_steps):
                mid = (good + bad) / 2
                if await measure(mid):
                    good = mid
                else:
                    bad = mid
    return {"points": points, "best": pick_best(points, p99_bound_ms)}


async def run_overload(session: aiohttp.ClientSession, base_url: str, workload: Workload,
                       base: RateConfig, capacity_rps: float, multiples: list[float], *,
                       cooldown_s: float = 2.0, progress: bool = True, report=print) -> dict:
    """Offer `capacity_rps` × each multiple (1.0 first: the reference point) and report what a
    service must keep past its capacity: goodput, accepted P99, how fast refusals come back."""
    points = []
    for i, multiple in enumerate(multiples):
        if i and cooldown_s > 0:
            await asyncio.sleep(cooldown_s)  # let the previous point's queue drain
        cfg = replace(base, rate=capacity_rps * multiple, seed=f"{base.seed}:overload:{i}")
        point, _ = await run_rate(session, base_url, workload, cfg, progress=progress)
        point["multiple"] = multiple
        points.append(point)
        report(f"x{multiple:g}: " + format_point(point))
    at_capacity = next((p for p in points if p["multiple"] == 1.0), None)
    return {
        "capacity_rps": capacity_rps,
        "capacity_items_per_s": at_capacity and at_capacity["achieved_items_per_s"],
        "p99_at_capacity_ms": at_capacity and at_capacity["latency_ms"]["p99"],
        "overload": [{"multiple": p["multiple"],
                      "offered_items_per_s": p["offered_items_per_s"],
                      "goodput_items_per_s": p["achieved_items_per_s"],
                      "accepted_p99_ms": p["latency_ms"]["p99"],
                      "refusal_p99_ms": p["refusal_latency_ms"]["p99"],
                      "refused": p["failures"].get("503", 0),
                      "other_failures": {k: v for k, v in p["failures"].items() if k != "503"}}
                     for p in points],
        "points": points,
    }


async def run_single(session: aiohttp.ClientSession, base_url: str, workload: Workload, *,
                     requests: int = 200, warmup_requests: int = 5, timeout_s: float = 30.0,
                     seed: int | str = 0, progress: bool = True) -> dict:
    """`requests` sequential requests (one at a time) after `warmup_requests` unmeasured ones:
    the latency of an idle service, and where it goes (`stages_ms`, from Server-Timing)."""
    url = base_url.rstrip("/") + workload.path
    factory = RequestFactory(workload, seed)
    ok, failures = [], {}
    for i in tqdm(range(warmup_requests + requests), desc="single", unit="req",
                  disable=not progress, leave=False, dynamic_ncols=True):
        body = factory.next_bytes()
        start = time.perf_counter()
        kind, stages = await send_one(session, url, body, workload.items, timeout_s,
                                      workload.result_key)
        elapsed = time.perf_counter() - start
        if i < warmup_requests:
            continue
        if kind == OK:
            ok.append(Outcome(0.0, 0.0, elapsed, kind, stages))
        else:
            failures[kind] = failures.get(kind, 0) + 1
    return {"requests": requests, "warmup_requests": warmup_requests,
            "successes": len(ok), "failed": sum(failures.values()),
            "failures": dict(sorted(failures.items())),
            "latency_ms": summarize_ms(o.done for o in ok), **where_time_went(ok)}


async def run_sporadic(session: aiohttp.ClientSession, base_urls: list[str],
                       workload: Workload | list[Workload], *, rate: float = 2.0,
                       requests: int = 60, warmup_requests: int = 3, timeout_s: float = 30.0,
                       seed: int | str = 0, progress: bool = True) -> list[dict]:
    """A lone request as a user sees it: `requests` (+ `warmup_requests` unmeasured) sent at a
    constant `rate`, each at its time whatever the state of the last one, cycling over
    `base_urls` (two services: A B A B, so drift hits both alike). One result per URL.
    `workload`: one for every URL, or a list, one per URL (the same service twice, with an
    adapter and without: each list entry draws the same texts, seeded alike).

    `single` sends back to back, so the service never idles; here each request records how long
    the service had been idle before it (`idle_before_ms`: since the last answer, of any URL).
    A request sent while another was unanswered counts as busy: its latency goes to
    `busy_latency_ms`, not to `latency_ms`, which holds only requests that found it idle."""
    workloads = workload if isinstance(workload, list) else [workload] * len(base_urls)
    if len(workloads) != len(base_urls):
        raise ValueError(f"{len(workloads)} workloads for {len(base_urls)} URLs")
    urls = [u.rstrip("/") + w.path for u, w in zip(base_urls, workloads)]
    # one factory per workload given; one shared by every URL otherwise (each URL its own texts)
    factories = ([RequestFactory(w, seed) for w in workloads] if isinstance(workload, list)
                 else [RequestFactory(workload, seed)] * len(base_urls))
    loop = asyncio.get_running_loop()
    inflight, last_done = 0, loop.time()
    seen: list[list[tuple[str, float, float | None, dict | None]]] = [[] for _ in urls]

    async def one(k: int, body: bytes) -> None:
        nonlocal inflight, last_done
        idle_before = None if inflight else loop.time() - last_done
        inflight += 1
        start = time.perf_counter()
        w = workloads[k % len(urls)]
        kind, stages = await send_one(session, urls[k % len(urls)], body, w.items, timeout_s,
                                      w.result_key)
        elapsed = time.perf_counter() - start
        inflight -= 1
        last_done = loop.time()
        if k >= warmup_requests * len(urls):
            seen[k % len(urls)].append((kind, elapsed, idle_before, stages))

    total = (warmup_requests + requests) * len(urls)
    t0, tasks = loop.time(), []
    for k in tqdm(range(total), desc=f"sporadic {rate:g} req/s", unit="req",
                  disable=not progress, leave=False, dynamic_ncols=True):
        body = factories[k % len(urls)].next_bytes()  # made before its send time
        await asyncio.sleep(max(0.0, t0 + k / rate - loop.time()))
        tasks.append(asyncio.create_task(one(k, body)))
    await asyncio.gather(*tasks)
    results = []
    for outcomes in seen:
        failures: dict[str, int] = {}
        for kind, *_ in outcomes:
            if kind != OK:
                failures[kind] = failures.get(kind, 0) + 1
        idle = [Outcome(0.0, 0.0, s, kind, stages)
                for kind, s, before, stages in outcomes if kind == OK and before is not None]
        busy = [s for kind, s, before, _ in outcomes if kind == OK and before is None]
        results.append({
            "requests": requests, "warmup_requests": warmup_requests, "rate": rate,
            "idle": len(idle), "busy": len(busy), "failed": sum(failures.values()),
            "failures": dict(sorted(failures.items())),
            "latency_ms": summarize_ms(o.done for o in idle),
            "busy_latency_ms": summarize_ms(busy),
            "idle_before_ms": summarize_ms(b for *_, b, _ in outcomes if b is not None),
            **where_time_went(idle)})
    return results


def format_point(p: dict) -> str:
    lat = p["latency_ms"]
    ms = " ".join(f"{k} {lat[k]:.1f}" if lat[k] is not None else f"{k} -"
                  for k in ("p50", "p90", "p99", "max"))
    line = (f"offered {p['offered_rps']:.2f} req/s ({p['offered_items_per_s']:.1f} items/s) | "
            f"achieved {p['achieved_rps']:.2f} req/s ({p['achieved_items_per_s']:.1f} items/s) | "
            f"ok {p['successes']} failed {p['failed']} {p['failures'] or ''}| ms {ms}")
    balance = p.get("scorers", {}).get("imbalance_queued_tokens")
    if balance is not None:
        line += f" | scorer imbalance {balance:.2f}"
    if p.get("behind_schedule"):  # tools/stats.py::client_behind
        line += (f" | CLIENT BEHIND: send lag p99 {p['send_lag_ms']['p99']:.0f} ms, "
                 f"{100 * (1 - p['on_time_share']):.1f}% sent late; add --clients")
    return line


async def _service_info(session: aiohttp.ClientSession, base_url: str) -> str | None:
    """Fails fast when /health is not 200; returns the served model name if /v1/models says."""
    base = base_url.rstrip("/")
    try:
        async with session.get(f"{base}/health", timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                raise SystemExit(f"{base}/health answered {r.status}: {await r.text()}")
        async with session.get(f"{base}/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as r:
            return (await r.json())["data"][0]["id"] if r.status == 200 else None
    except (aiohttp.ClientError, OSError) as exc:
        raise SystemExit(f"cannot reach {base}: {exc!r}") from None
    except (KeyError, IndexError, ValueError):
        return None


def _meta(args: argparse.Namespace, argv: list[str], model: str | None) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"tool": "tools/loadgen.py", "command": args.command, "argv": argv,
            "base_url": args.url, "model": model, "host": platform.node(),
            "python": platform.python_version(), "git_commit": commit,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


async def _main(args: argparse.Namespace, argv: list[str]) -> dict:
    workload = workload_from_args(args)
    progress = not args.no_progress
    async with make_session() as session:
        out = {"meta": _meta(args, argv, await _service_info(session, args.url)),
               "workload": workload.describe()}
        if args.command == "single":
            out["config"] = {"requests": args.requests, "warmup_requests": args.warmup_requests,
                             "timeout_s": args.timeout, "seed": args.seed}
            res = await run_single(session, args.url, workload, requests=args.requests,
                                   warmup_requests=args.warmup_requests, timeout_s=args.timeout,
                                   seed=args.seed, progress=progress)
            out["result"] = res
            lat = res["latency_ms"]
            print(f"single: {res['successes']}/{res['requests']} ok, failures {res['failures']} | "
                  f"p50 {lat['p50']} p99 {lat['p99']} max {lat['max']} ms | p50 ms by stage: "
                  + ", ".join(f"{k} {v['p50']}" for k, v in res["stages_ms"].items()))
            return out
        if args.command == "sporadic":
            out["config"] = {"rate": args.rate, "requests": args.requests,
                             "warmup_requests": args.warmup_requests, "timeout_s": args.timeout,
                             "seed": args.seed}
            res = (await run_sporadic(session, [args.url], workload, rate=args.rate,
                                      requests=args.requests,
                                      warmup_requests=args.warmup_requests,
                                      timeout_s=args.timeout, seed=args.seed,
                                      progress=progress))[0]
            out["result"] = res
            lat = res["latency_ms"]
            print(f"sporadic {args.rate:g} req/s: {res['idle']} found it idle (p50 {lat['p50']} "
                  f"p99 {lat['p99']} max {lat['max']} ms), {res['busy']} busy, failures "
                  f"{res['failures']} | p50 ms by stage: "
                  + ", ".join(f"{k} {v['p50']}" for k, v in res["stages_ms"].items()))
            return out
        cfg = RateConfig(getattr(args, "rate", 0.0), args.duration, args.warmup, args.arrival,
                         args.timeout, args.seed, args.clients,
                         find_metrics_url() if args.metrics_url == "auto" else args.metrics_url)
        out["config"] = asdict(cfg)
        if args.command in ("sweep", "overload"):
            del out["config"]["rate"]
        if args.command == "sweep":
            out["config"].update(rates=args.rates, start_rate=args.start_rate,
                                 factor=args.factor, max_rate=args.max_rate,
                                 bisect_steps=args.bisect_steps, cooldown_s=args.cooldown)
        if args.command == "run":
            out["result"], _ = await run_rate(session, args.url, workload, cfg, progress=progress)
            print(format_point(out["result"]))
            return out
        if args.command == "overload":
            out["config"].update(multiples=args.multiples, cooldown_s=args.cooldown)
            out.update(await run_overload(session, args.url, workload, cfg, args.capacity_rps,
                                          args.multiples, cooldown_s=args.cooldown,
                                          progress=progress, report=tqdm.write))
            return out
        res = await run_sweep(session, args.url, workload, cfg, args.p99_ms, rates=args.rates,
                              start_rate=args.start_rate, factor=args.factor,
                              max_rate=args.max_rate, bisect_steps=args.bisect_steps,
                              cooldown_s=args.cooldown, progress=progress,
                              report=lambda line: tqdm.write(line))
        out.update(p99_bound_ms=args.p99_ms, **res)
        best = res["best"]
        print(f"best with P99 <= {args.p99_ms:g} ms and 0 failures: " +
              (format_point(best) if best else "none (lower the rates)"))
        return out


def _raise_open_files_limit() -> None:
    """Open loop at high rates holds one socket per in-flight request."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass


def main(argv: list[str] | None = None) -> dict:
    """CLI entry; returns the JSON document it wrote (handy in-process, e.g. from tests)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    _raise_open_files_limit()
    out = asyncio.run(_main(args, argv))
    out_path = Path(args.out or RESULTS_DIR / f"loadgen_{args.command}.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if args.command == "sweep":
        out["plot"] = str(Path(args.plot) if args.plot else out_path.with_suffix(".png"))
    # The JSON first: the plot can always be redrawn from it (python -m tools.plot JSON).
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    if args.command == "sweep":
        try:
            from tools.plot import plot_from_json

            plot_from_json(out_path)
        except ImportError as exc:  # e.g. a GPU host without matplotlib
            print(f"no plot ({exc}); draw it later: python -m tools.plot {out_path}")
    print(f"wrote {out_path}" + (f" and {out['plot']}" if "plot" in out else ""))
    return out


if __name__ == "__main__":
    main()
