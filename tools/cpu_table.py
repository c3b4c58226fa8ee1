"""The README's CPU table ("What the default does, and how fast"), measured and written by one
command on the machine it describes:

  python -m tools.cpu_table                # start the CPU default, measure, stop it, write
                                           # docs/results/cpu/cpu.json, rewrite the README table
  python -m tools.cpu_table --quick --out /tmp/cpu.json   # a few requests per figure (~4 min)
  python -m tools.cpu_table --tables-only  # rewrite the README table from the JSON, no measuring
  python -m tools.cpu_table --check        # exit 1 where the README table differs from the JSON

It starts `serve run configs/score.yaml` itself on a free port (tools/service.py) and sends, over
HTTP, with tools/loadgen.py's functions in-process (run_sporadic, run_overload) and the README's
workload (natural English text, a 120-token query, items of 180 tokens, vocab 49152, labels
9230,2838):
- a lone request on an idle service, 1 item and 10 items (run_sporadic: a constant low rate,
  only the requests that found the service idle counted);
- the capacity estimate: 1 ÷ the lone 10-item p50, in 10-item requests/s (the 1× rate), then
  Poisson load of 10-item requests at OVERLOAD_MULTIPLES of it (run_overload): items/s answered,
  that ÷ the 1× point's (the 0.75× goodput ÷ 0.75), P99 of the answered, the 503s (count, p99)
  and any other failure;
- one 10,000-token /v1/score request with `x-request-timeout-seconds: 3` (a 408 after ~2.7 s),
  then at once a 1-item request: its latency (what an expired request still costs the next);
- one /v2/rerank of the README's 5,000-word document: its latency and token count;
- `serve run` to /health answering 200.
The measuring stays under MAX_MEASURE_S (every phase is bounded; a phase that does not fit is
"not measured"). Measure on an idle machine: a test run beside it slows a 10-item request several
times over (docs/DEVELOPING.md, "Benchmarks and harnesses").

The JSON: {"command", "quick", "complete", "cpu": {"model", "vendor", "flags", "cores"},
"commit", "tree_dirty", "measured_at", "seconds", "workload", "plan", "figures": {FIGURES key:
number | null}, "details"}; the README's block sits between `<!-- cpu:readme:start -->` and
`<!-- cpu:readme:end -->`, and tests/cpu/test_cpu_table.py fails when it is stale.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from tools import REPO_ROOT, RESULTS_DIR, doc_blocks, git_commit
from tools.configs import shipped_yaml
from tools.http_client import JSON_HEADERS, make_session, send_one
from tools.loadgen import RateConfig, run_overload, run_sporadic
from tools.service import start_service, stop_service
from tools.stats import OK
from tools.workload import RequestFactory, Workload

RESULT = RESULTS_DIR / "cpu" / "cpu.json"
README = REPO_ROOT / "README.md"
CONFIG = "score.yaml"
# The README's workload (its table's sentence says it): SmolLM2's vocabulary and its
# " Yes"/" No" token ids.
VOCAB = 49152
LABELS = (9230, 2838)
QUERY_TOKENS = 120
ITEM_TOKENS = 180
OVERLOAD_MULTIPLES = (0.75, 2.5, 5.0, 10.0)  # of the capacity estimate; 0.75 is the reference
EXPIRED_TOKENS = 10_000  # token ids: exactly this many, 10 items × 988 after the 120-token query
EXPIRED_DEADLINE_S = 3
RERANK_QUERY = "How do vaccines work?"
RERANK_DOCUMENT = "Vaccines train the immune system. " * 1000  # the README's 5,000 words
RERANK_DEADLINE_S = 120
# The service's own deadline is 60 s (configs/score.yaml's request_timeout_s): the client waits
# longer, so what the service answers is what is counted.
CLIENT_TIMEOUT_S = 65.0
# A lone 10-item request's p99 was 1.6 × its p50 on 2 cores (the README's table before this
# tool): twice the first one's latency apart, the next finds the service idle.
LONE_10_GAP = 2.0
RECOVERY_S = 90.0  # how long to wait for a 200 again after the expired request
MAX_MEASURE_S = 690  # with the start and the stop, the run stays under 12 minutes on 2 cores
MARKERS = ("<!-- cpu:readme:start -->", "<!-- cpu:readme:end -->")
NOT_MEASURED = "not measured"
FLAGS = ("avx2", "avx512f", "amx_tile")  # the instruction sets torch's CPU kernels dispatch on


def mx(multiple: float) -> str:
    """A multiple as it appears in key names: 0.75 → "0.75x", 5.0 → "5x"."""
    return f"{multiple:g}x"


# Every key of the JSON's `figures`, in this order; numbers (or null where not measured), but
# the overload points' other failures: {kind: count}.
FIGURES = (
    "serve_run_to_health_s",
    "lone_1_item_p50_s", "lone_1_item_p99_s", "lone_1_item_idle_requests",
    "lone_10_item_p50_s", "lone_10_item_p99_s", "lone_10_item_idle_requests",
    "capacity_10_item_rps", "capacity_items_per_s",
    *(f"overload_{mx(m)}_{name}" for m in OVERLOAD_MULTIPLES for name in (
        "offered_rps", "requests", "goodput_items_per_s", "goodput_ratio", "p99_s",
        "503_count", "503_p99_s", "other_failures")),
    "expired_request_status", "expired_request_s", "after_expired_1_item_s",
    "after_expired_1_item_status", "after_expired_first_200_s",
    "rerank_5000_words_s", "rerank_5000_words_tokens",
)


@dataclass(frozen=True)
class Plan:
    """How much of each phase a run sends."""

    lone_1_requests: int = 20
    lone_1_warmup: int = 2
    lone_1_rate: float = 0.5  # a 1-item request takes under a second: each finds it idle
    lone_10_requests: int = 10  # at a rate set from a first, timed one (lone_10)
    reference_s: float = 60.0  # the 0.75× point's window: a few 10-item requests at ~0.1 req/s
    reference_warmup_s: float = 10.0
    overload_s: float = 20.0  # the other points'
    overload_warmup_s: float = 5.0
    cooldown_s: float = 5.0  # a refused point's last batch ends before the next point


FULL = Plan()
QUICK = Plan(lone_1_requests=4, lone_1_warmup=1, lone_10_requests=2, reference_s=12.0,
             reference_warmup_s=3.0, overload_s=6.0, overload_warmup_s=2.0, cooldown_s=3.0)


def workload(items: int, **over) -> Workload:
    return Workload(query_len=QUERY_TOKENS, items=items, item_len=ITEM_TOKENS, labels=LABELS,
                    vocab=VOCAB, text="natural", **over)


# ---- the machine ------------------------------------------------------------------------------

def cpu_info(cpuinfo: str | None = None) -> dict:
    """The first processor of /proc/cpuinfo: its model name, vendor and the FLAGS it has; the
    logical CPUs this process may use."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count()
    return {"model": fields.get("model name", "unknown"), "vendor": fields.get("vendor_id",
            "unknown"), "flags": {f: f in flags for f in FLAGS}, "cores": cores}


def tree_dirty() -> bool | None:
    """Whether tracked files differ from the commit measured (None outside a git checkout)."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                         capture_output=True, text=True)
    return bool(out.stdout.strip()) if out.returncode == 0 else None


# ---- the measuring ----------------------------------------------------------------------------

def seconds(ms: float | None) -> float | None:
    return None if ms is None else round(ms / 1000.0, 3)


class Budget:
    """The run's MAX_MEASURE_S, shared out phase by phase."""

    def __init__(self, total_s: float) -> None:
        self.end = time.monotonic() + total_s

    def left(self) -> float:
        return self.end - time.monotonic()


async def bounded(name: str, coro, limit_s: float, budget: Budget, details: dict):
    """Run one phase within min(limit_s, what the budget has left); None where it did not fit."""
    limit = min(limit_s, budget.left())
    if limit <= 5:
        coro.close()
        details.setdefault("skipped", []).append(name)
        print(f"[{name}] skipped: the run's {MAX_MEASURE_S} s are spent", flush=True)
        return None
    started = time.monotonic()
    print(f"[{name}] start (bound {limit:.0f} s)", flush=True)
    try:
        result = await asyncio.wait_for(coro, limit)
    except TimeoutError:
        details.setdefault("timed_out", []).append(name)
        print(f"[{name}] passed its bound of {limit:.0f} s: not measured", flush=True)
        return None
    print(f"[{name}] done in {time.monotonic() - started:.0f} s", flush=True)
    return result


async def lone(session: aiohttp.ClientSession, url: str, items: int, requests: int,
               warmup: int, rate: float) -> dict:
    return (await run_sporadic(session, [url], workload(items), rate=rate, requests=requests,
                               warmup_requests=warmup, timeout_s=CLIENT_TIMEOUT_S,
                               seed=f"cpu-lone{items}", progress=False))[0]


async def lone_10(session: aiohttp.ClientSession, url: str, requests: int) -> dict:
    """One 10-item request, timed (the warm-up), then `requests` at one per LONE_10_GAP × its
    latency: a 10-item request takes seconds on a few cores, and one sent while the last is
    unanswered is no lone request (run_sporadic leaves it out)."""
    w = workload(10)
    started = time.perf_counter()
    kind, _ = await send_one(session, url + w.path, RequestFactory(w, "cpu-lone10-probe")
                             .next_bytes(), w.items, CLIENT_TIMEOUT_S, w.result_key)
    probe_s = time.perf_counter() - started
    rate = 1.0 / max(LONE_10_GAP * probe_s, 2.0)
    print(f"  first 10-item request: {kind} in {probe_s:.1f} s → {rate:.3f} req/s", flush=True)
    res = await lone(session, url, 10, requests, 0, rate)
    return res | {"probe": {"kind": kind, "seconds": round(probe_s, 3)}}


async def timed_post(session: aiohttp.ClientSession, url: str, body: bytes,
                     deadline_s: float) -> tuple[int | str, float, dict | None]:
    """(status or failure kind, seconds, JSON answer where 200) of one POST with the
    `x-request-timeout-seconds` deadline (docs/API.md, the 408 row)."""
    started = time.perf_counter()
    try:
        async with session.post(url, data=body, headers={
                **JSON_HEADERS, "x-request-timeout-seconds": str(deadline_s)},
                timeout=aiohttp.ClientTimeout(total=deadline_s + 10)) as r:
            payload = await r.read()
            status: int | str = r.status
    except TimeoutError:
        return "timeout", time.perf_counter() - started, None
    except aiohttp.ClientError:
        return "connection", time.perf_counter() - started, None
    elapsed = time.perf_counter() - started
    try:
        doc = json.loads(payload) if status == 200 else None
    except ValueError:
        doc = None
    return status, elapsed, doc


async def after_expired(session: aiohttp.ClientSession, url: str) -> dict:
    """A 10,000-token request that expires, then at once a 1-item request: what the expired
    one's work still costs (dropped between forwards: docs/ARCHITECTURE.md, "Load control")."""
    big = Workload(query_len=QUERY_TOKENS, items=10,
                   item_len=(EXPIRED_TOKENS - QUERY_TOKENS) // 10, labels=LABELS, vocab=VOCAB)
    status, took, _ = await timed_post(session, url + "/v1/score",
                                       RequestFactory(big, "cpu-expired").next_bytes(),
                                       EXPIRED_DEADLINE_S)
    small = workload(1)
    started = time.perf_counter()
    kind, _ = await send_one(session, url + small.path,
                             RequestFactory(small, "cpu-after-expired").next_bytes(), 1,
                             CLIENT_TIMEOUT_S, small.result_key)
    after_s = time.perf_counter() - started
    # Then until a 1-item request is answered again: the later phases start on an idle service
    # (and how long the expired request's work held it is a figure of its own).
    first_200 = after_s if kind == OK else None
    while first_200 is None and time.perf_counter() - started < RECOVERY_S:
        await asyncio.sleep(0.5)
        again, _ = await send_one(session, url + small.path, RequestFactory(
            small, "cpu-after-expired-retry").next_bytes(), 1, CLIENT_TIMEOUT_S,
            small.result_key)
        if again == OK:
            first_200 = time.perf_counter() - started
    return {"expired_request_tokens": big.tokens_per_request, "expired_request_status": status,
            "expired_request_s": round(took, 3),
            "after_expired_1_item_status": kind,
            "after_expired_1_item_s": round(after_s, 3),
            "after_expired_first_200_s": None if first_200 is None else round(first_200, 3)}


async def rerank(session: aiohttp.ClientSession, url: str) -> dict:
    body = json.dumps({"query": RERANK_QUERY, "documents": [RERANK_DOCUMENT]}).encode()
    status, took, doc = await timed_post(session, url + "/v2/rerank", body, RERANK_DEADLINE_S)
    tokens = ((doc or {}).get("usage") or {}).get("total_tokens")
    return {"status": status, "seconds": round(took, 3), "tokens": tokens,
            "words": len(RERANK_DOCUMENT.split())}


async def overload(session: aiohttp.ClientSession, url: str, capacity_rps: float,
                   plan: Plan, budget: Budget, details: dict) -> dict:
    """run_overload at the reference multiple (a longer window: few requests fit one at this
    rate), then at the others."""
    groups = [(OVERLOAD_MULTIPLES[:1], plan.reference_s, plan.reference_warmup_s),
              (OVERLOAD_MULTIPLES[1:], plan.overload_s, plan.overload_warmup_s)]
    points: dict[str, dict] = {}
    for k, (multiples, window_s, warmup_s) in enumerate(groups):
        if k:
            await asyncio.sleep(plan.cooldown_s)
        cfg = RateConfig(capacity_rps, duration_s=window_s, warmup_s=warmup_s,
                         timeout_s=CLIENT_TIMEOUT_S, seed=f"cpu-overload{k}", clients=1)
        # each point: its schedule, then the last answer (the client's timeout at most)
        limit = len(multiples) * (warmup_s + window_s + CLIENT_TIMEOUT_S + plan.cooldown_s)
        res = await bounded(f"load at {', '.join(f'{m:g}×' for m in multiples)}",
                            run_overload(session, url, workload(10), cfg,
                                         capacity_rps, list(multiples),
                                         cooldown_s=plan.cooldown_s, progress=False,
                                         report=lambda line: print("  " + line, flush=True)),
                            limit, budget, details)
        if res is None:
            continue
        for summary, point in zip(res["overload"], res["points"]):
            points[mx(summary["multiple"])] = {"summary": summary, "point": point}
    return points


def overload_figures(points: dict[str, dict]) -> dict:
    figures = {}
    reference = points.get(mx(OVERLOAD_MULTIPLES[0]))
    # the 1× point's goodput, from the reference point's: it answered what it was offered
    one_x = (reference["summary"]["goodput_items_per_s"] / OVERLOAD_MULTIPLES[0]
             if reference and reference["summary"]["goodput_items_per_s"] else None)
    for m in OVERLOAD_MULTIPLES:
        entry = points.get(mx(m))
        if entry is None:
            continue
        s, p = entry["summary"], entry["point"]
        key = f"overload_{mx(m)}"
        figures |= {
            f"{key}_offered_rps": p["offered_rps"],
            f"{key}_requests": p["measured_requests"],
            f"{key}_goodput_items_per_s": s["goodput_items_per_s"],
            f"{key}_goodput_ratio": round(s["goodput_items_per_s"] / one_x, 3) if one_x else None,
            f"{key}_p99_s": seconds(s["accepted_p99_ms"]),
            f"{key}_503_count": s["refused"],
            f"{key}_503_p99_s": seconds(s["refusal_p99_ms"]),
            f"{key}_other_failures": s["other_failures"],
        }
    return figures


async def measure(url: str, plan: Plan, budget: Budget, figures: dict, details: dict,
                  measured) -> None:
    """Every phase in turn into `figures` and `details`; `measured()` after each (the JSON
    is written as it goes)."""
    async with make_session() as session:
        for items in (1, 10):
            if items == 1:
                limit = ((plan.lone_1_requests + plan.lone_1_warmup) / plan.lone_1_rate
                         + CLIENT_TIMEOUT_S)
                phase = lone(session, url, 1, plan.lone_1_requests, plan.lone_1_warmup,
                             plan.lone_1_rate)
            else:  # at most a 20 s request every 40 s
                limit = (plan.lone_10_requests + 1) * 2 * CLIENT_TIMEOUT_S / 3
                phase = lone_10(session, url, plan.lone_10_requests)
            res = await bounded(f"lone {items} item(s)", phase, limit, budget, details)
            if res is not None:
                details[f"lone_{items}_item"] = res
                lat = res["latency_ms"]
                figures.update({f"lone_{items}_item_p50_s": seconds(lat["p50"]),
                                f"lone_{items}_item_p99_s": seconds(lat["p99"]),
                                f"lone_{items}_item_idle_requests": res["idle"]})
                print(f"  idle {res['idle']} busy {res['busy']} failures {res['failures']} | "
                      f"p50 {lat['p50']} p99 {lat['p99']} ms", flush=True)
            measured()

        res = await bounded("a 1-item request after one that expired",
                            after_expired(session, url), RECOVERY_S + 2 * CLIENT_TIMEOUT_S,
                            budget, details)
        if res is not None:
            details["after_expired"] = res
            figures.update({k: v for k, v in res.items() if k in FIGURES})
            print(f"  {res}", flush=True)
        measured()

        res = await bounded("rerank of 5,000 words", rerank(session, url),
                            RERANK_DEADLINE_S + 15, budget, details)
        if res is not None:
            details["rerank_5000_words"] = res
            if res["status"] == 200:
                figures.update(rerank_5000_words_s=res["seconds"],
                               rerank_5000_words_tokens=res["tokens"])
            print(f"  {res}", flush=True)
        measured()

        p50 = figures.get("lone_10_item_p50_s")
        if not p50:
            print("[load] no lone 10-item p50: no capacity estimate, no load", flush=True)
            return
        capacity = 1.0 / p50
        figures.update(capacity_10_item_rps=round(capacity, 4),
                       capacity_items_per_s=round(10 * capacity, 3))
        points = await overload(session, url, capacity, plan, budget, details)
        details["overload"] = points
        figures.update(overload_figures(points))
        measured()


# ---- the README block -------------------------------------------------------------------------

def _s(value: float | None) -> str:
    if value is None:
        return NOT_MEASURED
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def _pair(figures: dict, key: str) -> str:
    p50, p99 = figures.get(f"{key}_p50_s"), figures.get(f"{key}_p99_s")
    if p50 is None and p99 is None:
        return NOT_MEASURED
    return f"p50 {_s(p50)}, p99 {_s(p99)}"


def _failures(other: dict | None) -> str:
    if not other:
        return "no other failure"
    return "other failures: " + ", ".join(f"{n} {kind}" for kind, n in sorted(other.items()))


def _load_row(figures: dict, m: float) -> tuple[str, str]:
    key = f"overload_{mx(m)}"
    rps = figures.get(f"{key}_offered_rps")
    label = (f"10-item requests, Poisson arrivals at {m:g}× that"
             + (f" ({rps:.3f} req/s)" if rps is not None else ""))
    goodput = figures.get(f"{key}_goodput_items_per_s")
    if goodput is None:
        return label, NOT_MEASURED
    ratio = figures.get(f"{key}_goodput_ratio")
    parts = [f"{goodput:.2f} items/s answered"
             + ("" if m == OVERLOAD_MULTIPLES[0] or ratio is None else f" ({ratio:.2f} of 1×)")
             + (f" at P99 {_s(figures.get(f'{key}_p99_s'))}"
                if figures.get(f"{key}_p99_s") is not None else
                ", none sent in its window answered")]
    refused = figures.get(f"{key}_503_count") or 0
    parts.append(f"{refused} × 503" + (f" (p99 {_s(figures.get(f'{key}_503_p99_s'))})"
                                        if refused else ""))
    parts.append(_failures(figures.get(f"{key}_other_failures")))
    return label, "; ".join(parts)


def rows(doc: dict) -> list[tuple[str, str]]:
    """The table's (figure, value) rows from a cpu.json document."""
    f = doc["figures"]
    capacity = f.get("capacity_10_item_rps")
    status, took = f.get("expired_request_status"), f.get("expired_request_s")
    expired = (f" (`x-request-timeout-seconds: {EXPIRED_DEADLINE_S}`: {status} after "
               f"{_s(took)})" if status is not None else
               f" (`x-request-timeout-seconds: {EXPIRED_DEADLINE_S}`)")
    after = f.get("after_expired_1_item_s")
    after_status = f.get("after_expired_1_item_status")
    first_200 = f.get("after_expired_first_200_s")
    recovered = ("" if after_status in (None, OK) or first_200 is None else
                 f"; a 1-item request answered 200 again {_s(first_200)} after the 408")
    tokens = f.get("rerank_5000_words_tokens")
    out = [
        ("a lone request on an idle service, 1 item", _pair(f, "lone_1_item")),
        ("a lone request on an idle service, 10 items", _pair(f, "lone_10_item")),
        ("capacity estimate (1×): 1 ÷ the lone 10-item p50",
         NOT_MEASURED if capacity is None else
         f"{capacity:.3f} req/s ({f.get('capacity_items_per_s'):.2f} items/s)"),
        *(_load_row(f, m) for m in OVERLOAD_MULTIPLES),
        (f"the next 1-item request after a {EXPIRED_TOKENS:,}-token one expired{expired}",
         NOT_MEASURED if after is None else
         _s(after) + ("" if after_status in (None, OK) else f" ({after_status})") + recovered),
        ("one `/v2/rerank` of a 5,000-word document"
         + (f" ({tokens:,} tokens)" if tokens is not None else ""),
         _s(f.get("rerank_5000_words_s"))),
        (f"`serve run configs/{CONFIG}` to `/health` answering 200",
         _s(f.get("serve_run_to_health_s"))),
    ]
    return out


def machine(cpu: dict) -> str:
    """"AMD EPYC (AuthenticAMD; AVX2, no AVX-512F, no AMX), 2 cores"."""
    names = {"avx2": "AVX2", "avx512f": "AVX-512F", "amx_tile": "AMX"}
    isa = ", ".join(name if cpu["flags"].get(flag) else f"no {name}"
                    for flag, name in names.items())
    return f"{cpu['model']} ({cpu['vendor']}; {isa}), {cpu['cores']} cores"


def readme_block(doc: dict) -> str:
    cpu = doc["cpu"]
    commit = doc["commit"] + (" with uncommitted changes" if doc.get("tree_dirty") else "")
    quick = (" A quick run (`--quick`: a few requests per figure), not figures to quote."
             if doc.get("quick") else "")
    incomplete = ("" if doc.get("complete", True) else
                  " The run stopped early: the figures it did not reach say so.")
    table = [f"| default SmolLM2-135M on CPU, {cpu['cores']}-core machine | figure |",
             "| --- | --- |", *(f"| {label} | {value} |" for label, value in rows(doc))]
    return "\n".join([
        f"Its figures on {machine(cpu)}, {doc['measured_at'][:10]}, commit {commit}, over HTTP "
        f"with the project's load tool (natural English text, a {QUERY_TOKENS}-token query, "
        f"items of {ITEM_TOKENS} tokens): `{doc['command']}` "
        f"([JSON](docs/results/cpu/cpu.json)).{quick}{incomplete}", "", *table])


def block(text: str) -> str:
    """What stands between the markers (ValueError where they are missing)."""
    return doc_blocks.block(text, MARKERS)


def with_block(text: str, body: str) -> str:
    return doc_blocks.with_block(text, MARKERS, body)


def write_readme(doc: dict, check: bool, readme: Path = README) -> int:
    text, body = readme.read_text(), readme_block(doc)
    if block(text) == body:
        print("README's CPU table up to date")
        return 0
    if check:
        print("README's CPU table is stale: python -m tools.cpu_table --tables-only")
        return 1
    readme.write_text(with_block(text, body))
    print(f"rewrote {readme}'s CPU table")
    return 0


def print_table(doc: dict) -> None:
    width = max(len(label) for label, _ in rows(doc))
    for label, value in rows(doc):
        print(f"{label:{width}s}  {value}")


# ---- the run ----------------------------------------------------------------------------------

def run(plan: Plan, out: Path, quick: bool, argv: list[str]) -> dict:
    started = time.monotonic()
    figures = dict.fromkeys(FIGURES)
    details: dict = {}
    doc = {"command": "python -m tools.cpu_table" + (" " + shlex.join(argv) if argv else ""),
           "quick": quick, "complete": False, "cpu": cpu_info(), "commit": git_commit(),
           "tree_dirty": tree_dirty(), "measured_at": None, "seconds": None,
           "workload": {"text": "natural", "query_tokens": QUERY_TOKENS,
                        "item_tokens": ITEM_TOKENS, "vocab": VOCAB, "labels": list(LABELS),
                        "config": f"configs/{CONFIG}",
                        "capacity": "1 ÷ the lone 10-item p50: the 1× rate, an estimate",
                        "goodput_ratio": f"goodput ÷ (the {OVERLOAD_MULTIPLES[0]:g}× point's "
                                         f"goodput ÷ {OVERLOAD_MULTIPLES[0]:g}): relative to 1×",
                        "overload_multiples": list(OVERLOAD_MULTIPLES),
                        "expired_request": f"{EXPIRED_TOKENS} token ids (10 items after the "
                                           f"query), x-request-timeout-seconds: "
                                           f"{EXPIRED_DEADLINE_S}",
                        "rerank_document": f"{RERANK_QUERY!r}, 'Vaccines train the immune "
                                           "system. ' × 1000"},
           "plan": asdict(plan), "figures": figures, "details": details}

    def write() -> None:
        doc.update(measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   seconds=round(time.monotonic() - started))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")

    print(f"[serve run configs/{CONFIG}] starting", flush=True)
    t0 = time.monotonic()
    service = start_service(shipped_yaml(CONFIG))
    try:
        figures["serve_run_to_health_s"] = round(time.monotonic() - t0, 2)
        print(f"[serve run] /health 200 after {figures['serve_run_to_health_s']} s at "
              f"{service.url}", flush=True)
        asyncio.run(measure(service.url, plan, Budget(MAX_MEASURE_S), figures, details, write))
        doc["complete"] = True
    finally:  # what was measured is written, also when a phase failed
        print("[serve run] stopping", flush=True)
        stop_service(service)
        write()
    print(f"measured in {doc['seconds']} s; wrote {out}")
    return doc


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few requests per phase (a check "
                   "of the tool, not figures to quote)")
    p.add_argument("--tables-only", action="store_true",
                   help="rewrite the README table from the JSON; measure nothing")
    p.add_argument("--check", action="store_true",
                   help="exit 1 where the README table differs from the JSON")
    p.add_argument("--out", type=Path, default=RESULT,
                   help="the JSON to write (or, with --tables-only/--check, to read); the "
                   "README is rewritten only from the default one, which it links")
    args = p.parse_args(argv)
    out = args.out.resolve()
    if args.tables_only or args.check:
        doc = json.loads(out.read_text())
        if args.tables_only:
            print_table(doc)
        return write_readme(doc, check=args.check)
    # `timeout` stops a run with SIGTERM: leave through the finally block (service stopped)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    doc = run(QUICK if args.quick else FULL, out, args.quick, argv)
    print()
    print_table(doc)
    if out != RESULT.resolve():
        print(f"README left as it is: its table comes from {RESULT.relative_to(REPO_ROOT)}")
        return 0
    return write_readme(doc, check=False)


if __name__ == "__main__":
    sys.exit(main())
