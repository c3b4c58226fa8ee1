"""Check the Grafana board docs/grafana/ranker_dashboard.json against a real Prometheus.

Starts the service (`serve run` of configs/score.yaml on the small random model of
tools/random_model.py) and a Prometheus that scrapes Ray's service-discovery file
(tools/prometheus_server.py); checks the Ray dashboard's Serve API and `serve status` with
Ray's token authentication on; checks that every counter series the board plots exists at 0
before any traffic; then sends traffic with bad requests (400, 413), refusals (503: a full scorer
queue) and drops (clients that hang up, requests past their timeout: 408) and runs every query
of the board through Prometheus's HTTP API, its model selector set to All (each query of a metric
with a `model` label must filter by it). It fails (exit 1) unless every query returns data,
the error, refusal and drop panels show the events in their rate, and what Prometheus counted
over the run equals what was sent, first events included (sent to the ingress: a 503 of Serve's
own back-pressure never reached it, and is tallied apart). Prints a table of panel -> value.

Usage: python -m tools.check_dashboard     # about 2 minutes on 2 cores; no options
(`python tools/check_dashboard.py` works too.) Needs a `prometheus` binary on PATH
(`bash scripts/setup.sh` installs Debian's when run as root).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run by path, too

from gpu_worker.serving.metrics import BATCH_ERROR_TYPES, CACHE_RESULTS  # noqa: E402
from serve_app.auth import NO_KEY  # noqa: E402
from serve_app.metrics import ERRORS  # noqa: E402
from serve_app.routes import ROUTES  # noqa: E402
from tools.prom import scrape, service_sample  # noqa: E402
from tools.prometheus_server import find_prometheus, start_prometheus  # noqa: E402
from tools.random_model import make_random_model  # noqa: E402
from tools.ray_dashboard import auth_token, get, serve_applications, serve_status  # noqa: E402
from tools.service import FAST_METRICS_ENV, small_model_config, start_service, stop_service  # noqa: E402
from tools.workload import RequestFactory, Workload  # noqa: E402

BOARD = REPO / "docs" / "grafana" / "ranker_dashboard.json"
VOCAB = 49152  # the small model's (the default model's tokenizer)
SMALL = Workload(query_len=40, items=4, item_len=40, vocab=VOCAB)  # ~200 tokens
TEXT = Workload(query_len=40, items=4, item_len=40, vocab=VOCAB, text="natural")
# ~1,650 tokens in two sequences (max_seq_tokens 1024): about 0.4 s of scorer work each
LARGE = Workload(query_len=40, items=8, item_len=200, vocab=VOCAB)
# The scorer's load bound, in seconds of its measured work: the FILLS of the drop scene stay
# within it on a slow busy machine (a large request up to 2.5 s), the burst passes it twice
# over on any (its size is set by the time one large request takes alone)
MAX_QUEUE_WAIT_S = 10
MAX_BURST = 200
FILLS = 4  # large requests queued ahead of the abandoned ones (within MAX_QUEUE_WAIT_S)
DROP_ROUNDS = 4
METRICS_REPORT_S = 1.5  # the scorer publishes every 0.5 s, Ray exports every 1 s (FAST_METRICS_ENV)
TRICKLE_RPS = 1.5  # well below what one scorer does on a busy 2-core box
DEADLINE_S = 90  # for any state awaited (series scraped, counts settled)
JSON = {"Content-Type": "application/json"}
# Serve's proxy answers 503 in plain text, before the ingress sees the request, when the ingress
# replica's max_ongoing_requests + max_queued_requests are taken (docs/API.md, 503). Its count of
# requests not yet handed to a replica runs ahead under a burst, so the burst scene can meet it
# below that sum: the ingress counts none of these, and nor does the board.
SERVE_BACKPRESSURE = "Request dropped due to backpressure"
# A panel expression `rate(METRIC[1m])` (or `rate(METRIC{...}[1m])`) counts the events of the
# run as `(METRIC{...} - METRIC{...} offset Ws)`: exact (counters start at 0), and empty for a
# series that did not exist W s ago.
RATE = re.compile(r"rate\((ray_ranker_\w+_total)(\{[^}]*\})?\[1m\]\)")
# The board's model selector: the metrics with a `model` label are filtered by it, and the check
# reads the board as Grafana does with "All" chosen (the variable's allValue).
MODEL_FILTER = 'model=~"$model"'
MODEL_METRICS = ("ray_ranker_requests_total", "ray_ranker_errors_total",
                 "ray_ranker_request_latency_ms_bucket", "ray_ranker_items_total",
                 "ray_ranker_key_items_total", "ray_ranker_key_tokens_total")

# Bad requests and the status each must get.
BAD = [
    ("/v1/score", b"{not json", 400),
    ("/v1/score", {"items": [[1]], "label_token_ids": [1], "bogus": 1}, 400),
    ("/v1/score", {"query": [1], "label_token_ids": [1]}, 400),
    ("/v1/score", {"query": [1], "items": [[2]], "label_token_ids": [VOCAB]}, 400),
    ("/v1/rerank", {"query": "q"}, 400),
    ("/v2/rerank", {"query": "q", "documents": ["d"], "top_n": 0}, 400),
    ("/v1/score", {"query": [1], "items": [[1]] * 10_001, "label_token_ids": [1]}, 413),
    ("/v1/score", {"query": [1] * 100, "items": [[1] * 1000] * 9, "label_token_ids": [1]}, 413),
]


def usage_tokens(body: dict) -> int:
    """A 200's tokens as its usage gives them: /v1/score's `usage.prompt_tokens`, rerank's
    `meta.tokens.input_tokens`."""
    if "meta" in body:
        return body["meta"]["tokens"]["input_tokens"]
    return body["usage"]["prompt_tokens"]


class Traffic:
    """Sends requests and tallies what the service must have counted."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url, self.session = url, session
        self.answered: Counter[tuple[str, str]] = Counter()  # (route, status) as the ingress sees
        self.serve_refused = 0  # 503s of Serve's proxy: the ingress never saw them (no panel)
        self.items_scored = 0  # items of the answered 200s
        self.tokens_scored = 0  # tokens of the answered 200s, as their usage says
        self.refused = 0  # 503s with the scorer's envelope: refused by a scorer
        self.shed = 0  # 503s the ingress answered before reading (serve_app/shedding.py)
        self.abandoned = 0  # hung up by the client or timed out (408)
        self.problems: list[str] = []
        self.scenes: dict[str, Counter[int]] = {}  # scene -> statuses (0: hung up), to report

    async def post(self, route: str, body: bytes, items: int = 0, timeout_s: float = 120,
                   headers: dict | None = None, scene: str = "good") -> int:
        """POST; returns the status, 0 when the client hung up (the ingress counts 408)."""
        try:
            async with self.session.post(f"{self.url}{route}", data=body,
                                         headers={**JSON, **(headers or {})},
                                         timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                text = await r.text()
                status = r.status
                if status == 200:
                    self.tokens_scored += usage_tokens(json.loads(text))
        except TimeoutError:
            status, text = 0, ""
        self.scenes.setdefault(scene, Counter())[status] += 1
        if status == 503 and not text.startswith('{"error"'):  # not the ingress's answer
            if text.startswith(SERVE_BACKPRESSURE):
                self.serve_refused += 1
            else:
                self.problems.append(f"a 503 from neither the ingress nor Serve's back-pressure: "
                                     f"{text[:200]!r}")
            return status
        self.answered[(route, str(status or 408))] += 1
        if status == 200:
            self.items_scored += items
        elif status == 503:
            if "(shedding)" in text:  # counted by the ingress only: no scorer saw it
                self.shed += 1
            else:
                self.refused += 1
        if status in (0, 408):
            self.abandoned += 1
        return status

    async def good(self, i: int) -> int:
        kind = i % 4
        if kind < 2:  # token ids, then text, on /v1/score
            factory = RequestFactory(TEXT if kind else SMALL, f"good{i}")
            return await self.post("/v1/score", factory.next_bytes(), SMALL.items)
        factory = RequestFactory(TEXT, f"rerank{i}")
        query, docs = factory.texts()
        body = json.dumps({"query": query, "documents": docs}).encode()
        return await self.post("/v1/rerank" if kind == 2 else "/v2/rerank", body, len(docs))

    async def trickle(self, stop: asyncio.Event) -> None:
        """Steady good traffic on every route (the latency, batch and tokenize panels)."""
        tasks, i = [], 0
        while not stop.is_set():
            tasks.append(asyncio.create_task(self.good(i)))
            i += 1
            await asyncio.sleep(1 / TRICKLE_RPS)
        await asyncio.gather(*tasks)

    async def bad(self) -> None:
        for route, body, expected in BAD:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            status = await self.post(route, raw, scene="bad")
            if status != expected:
                self.problems.append(f"{route} {raw[:60]!r}: {status}, expected {expected}")

    async def refusals(self) -> None:
        """A burst of twice MAX_QUEUE_WAIT_S of large requests, by the time one takes alone
        (which also gives the scorer its throughput: a large request's sequences are full
        batches), so some could not start within the bound."""
        factory = RequestFactory(LARGE, "burst")
        started = time.monotonic()
        await self.post("/v1/score", factory.next_bytes(), LARGE.items, scene="measure")
        burst = min(MAX_BURST, math.ceil(2 * MAX_QUEUE_WAIT_S / (time.monotonic() - started)))
        await asyncio.gather(*(self.post("/v1/score", factory.next_bytes(), LARGE.items,
                                         scene="burst") for _ in range(burst)))
        if not self.refused:
            self.problems.append(f"a burst of {burst} large requests got no 503 from a scorer")

    async def drops(self, metrics_url: str) -> None:
        """Small requests abandoned while queued behind large ones, at a moment set by this
        machine's own speed: the client deadline is the time one large request takes alone,
        measured just before, and FILLS of them are queued ahead, so the deadline passes with
        most of that backlog still ahead, on a fast idle machine as on a slow busy one. A round
        whose abandoned requests were all answered or dropped before reaching the scorer is run
        again with half the deadline, until the scorer counts a drop."""
        large, small = RequestFactory(LARGE, "fill"), RequestFactory(SMALL, "gone")
        deadline_s = None
        for round_no in range(1, DROP_ROUNDS + 1):
            before = await self._settled_drops(metrics_url)
            if deadline_s is None:
                started = time.monotonic()
                await self.post("/v1/score", large.next_bytes(), LARGE.items, scene="measure")
                deadline_s = time.monotonic() - started
            print(f"drop scene, round {round_no}: client deadline {deadline_s * 1e3:.0f} ms")
            fills = [asyncio.create_task(self.post("/v1/score", large.next_bytes(), LARGE.items,
                                                   scene="fill")) for _ in range(FILLS)]
            await asyncio.sleep(deadline_s / 4)  # the fills reach the scorer first
            await asyncio.gather(
                *(self.post("/v1/score", small.next_bytes(), SMALL.items, timeout_s=deadline_s,
                            scene="hang up") for _ in range(3)),
                *(self.post("/v1/score", small.next_bytes(), SMALL.items, scene="time out",
                            headers={"x-request-timeout-seconds": f"{deadline_s:.3f}"})
                  for _ in range(3)))
            await asyncio.gather(*fills)
            if await self._settled_drops(metrics_url) > before:
                return
            deadline_s /= 2
        self.problems.append(f"no sequence dropped in {DROP_ROUNDS} rounds of abandoned requests")

    async def _settled_drops(self, metrics_url: str) -> float:
        """The scorer's drop count once its queue is empty and the count has been published."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            first = service_sample(await asyncio.to_thread(scrape, metrics_url))
            await asyncio.sleep(2 * METRICS_REPORT_S)  # a drop counted now is published by then
            second = service_sample(await asyncio.to_thread(scrape, metrics_url))
            idle = not (first.queued_tokens or first.inflight_tokens or second.queued_tokens
                        or second.inflight_tokens)
            if idle and first.dropped == second.dropped:
                return second.dropped
            if time.monotonic() > deadline:
                self.problems.append(f"scorer queue not settled after {DEADLINE_S} s")
                return second.dropped


async def send_traffic(url: str, metrics_url: str) -> Traffic:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        traffic, stop = Traffic(url, session), asyncio.Event()
        trickle = asyncio.create_task(traffic.trickle(stop))
        await asyncio.sleep(2)
        await traffic.bad()
        await traffic.refusals()
        await traffic.drops(metrics_url)
        await asyncio.sleep(3)
        stop.set()
        await trickle
    return traffic


def wait_for(check, what: str, state=None) -> None:
    """`state`: what to report when `check` is still false at the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {DEADLINE_S} s"
                                 + (f": {state()}" if state else ""))
        time.sleep(0.5)


def total(prom, expr: str, at: float | None = None) -> float:
    return sum(float(r["value"][1]) for r in prom.query(expr, at))


def check_dashboard_access(svc) -> list[str]:
    """The dashboard's Serve API and `serve status` with authentication on, as a user does."""
    dashboard, token, problems = svc.dashboard_url(), auth_token(), []
    if (status := get(f"{dashboard}/api/serve/applications/")[0]) != 401:
        problems.append(f"the dashboard answered {status} without the token, not 401")
    deployments = serve_applications(dashboard, token)["applications"]["score"]["deployments"]
    states = {name: d["status"] for name, d in deployments.items()}
    if states != {"ScoreIngress": "HEALTHY", "ScoreWorker": "HEALTHY"}:
        problems.append(f"dashboard Serve API: {states}")
    out = serve_status(dashboard)
    if out.returncode != 0 or out.stdout.count("HEALTHY") < 2:
        problems.append(f"`serve status` with the token: rc {out.returncode}\n{out.stdout}"
                        f"{out.stderr[-1500:]}")
    print(f"dashboard {dashboard}: 401 without the token; with it, Serve API {states}; "
          f"`RAY_AUTH_MODE=token serve status`: rc {out.returncode}")
    return problems


def zero_series() -> dict[str, int]:
    """Counter series the board plots that must exist at 0 from start-up (one replica each;
    `model`: the served model and NO_MODEL, the service having no adapters)."""
    return {"ray_ranker_requests_total": len(ROUTES) * (1 + len(ERRORS)) * 2,
            "ray_ranker_errors_total": len(ROUTES) * len(ERRORS) * 2,
            "ray_ranker_key_items_total": 2,
            "ray_ranker_key_tokens_total": 2,
            "ray_ranker_scorer_retries_total": 1,
            "ray_ranker_items_scored_total": 1,
            "ray_ranker_sequences_dropped_total": 1,
            "ray_ranker_requests_rejected_total": 1,
            "ray_ranker_batch_errors_total": len(BATCH_ERROR_TYPES),
            "ray_ranker_prefix_cache_lookups_total": len(CACHE_RESULTS),
            "ray_ranker_prefix_cache_tokens_reused_total": 1,
            "ray_ranker_prefix_cache_evictions_total": 1}


def expected_counts(metric: str, keys: tuple[str, ...], traffic: Traffic,
                    dropped: float) -> dict[tuple, float]:
    """Per label values of the panel's `sum by (keys)`, what the run must have counted. The
    service runs without API keys: every request carries the key id NO_KEY."""
    if metric in ("ray_ranker_requests_total", "ray_ranker_errors_total"):
        kinds = dict(ERRORS)
        counts: Counter[tuple] = Counter()
        for (route, status), n in traffic.answered.items():
            if metric == "ray_ranker_errors_total" and status == "200":
                continue
            labels = {"route": route, "status": status, "key": NO_KEY,
                      "error_type": kinds.get(status, "")}
            counts[tuple(labels[k] for k in keys)] += n
        return {k: float(v) for k, v in counts.items()}
    if metric in ("ray_ranker_key_items_total", "ray_ranker_key_tokens_total"):
        tally = traffic.items_scored if metric == "ray_ranker_key_items_total" else \
            traffic.tokens_scored
        return {tuple({"key": NO_KEY}[k] for k in keys): float(tally)}
    return {(): {"ray_ranker_items_scored_total": traffic.items_scored,
                 "ray_ranker_requests_rejected_total": traffic.refused,
                 "ray_ranker_sequences_dropped_total": dropped,
                 "ray_ranker_scorer_retries_total": 0,
                 "ray_ranker_batch_errors_total": 0,
                 # The check runs without a prefix cache (its counting: test_prefix_cache_http)
                 "ray_ranker_prefix_cache_lookups_total": 0,
                 "ray_ranker_prefix_cache_tokens_reused_total": 0,
                 "ray_ranker_prefix_cache_evictions_total": 0}[metric]}


def by_labels(result: list[dict], keys: tuple[str, ...]) -> dict[tuple, float]:
    return {tuple(r["metric"].get(k, "") for k in keys): float(r["value"][1]) for r in result}


def check_panels(prom, traffic: Traffic, dropped: float, started: float,
                 at: float) -> tuple[list[list[str]], list[str]]:
    rows, problems = [], []
    window_s = math.ceil(at - started)
    for panel in json.loads(BOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr, title = target["expr"], panel["title"]
            if any(m in expr for m in MODEL_METRICS) and MODEL_FILTER not in expr:
                problems.append(f"{title}: {expr} ignores the model selector")
            expr = expr.replace("$model", model_all())
            legend = target.get("legendFormat", "")
            result = prom.query(expr, at)
            if not result or any(not math.isfinite(float(r["value"][1])) for r in result):
                problems.append(f"{title} [{legend}]: no data ({result}) for {expr}")
            values = ", ".join(f"{legend_of(legend, r['metric'])}={float(r['value'][1]):.3g}"
                               for r in result)
            counted, sent = "", ""
            if match := RATE.search(expr):
                counted, sent = check_counts(prom, expr, match[1], traffic, dropped,
                                             window_s, at, problems, title)
            rows.append([title, legend, values or "(none)", counted, sent])
    return rows, problems


def check_counts(prom, expr: str, metric: str, traffic: Traffic,
                 dropped: float, window_s: int, at: float, problems: list[str],
                 title: str) -> tuple[str, str]:
    """A counting panel: its rate showed every kind of event sent at some time of the run (the
    highest value of the panel's expression over the run: a scene early in a run that lasts more
    than the rate's minute has left the panel by its end, as on a slow machine), and what
    Prometheus counted over the run (the same expression on `METRIC - METRIC offset W`) equals
    what was sent. Returns (counted, sent) for the table."""
    grouped = re.match(r"sum by \(([^)]*)\)", expr)
    keys = tuple(k.strip() for k in grouped[1].split(",")) if grouped else ()
    run_expr = RATE.sub(lambda m: f"({m[1]}{m[2] or ''} - {m[1]}{m[2] or ''} offset {window_s}s)",
                        expr)
    got = by_labels(prom.query(run_expr, at), keys)
    shown = by_labels(prom.query(f"max_over_time(({expr})[{window_s}s:1s])", at), keys)
    if keys == ("replica",):  # items per replica: the run's total is what was sent
        got, shown = {(): sum(got.values())}, {(): max(shown.values(), default=0)}
    want = expected_counts(metric, keys, traffic, dropped)
    for key in sorted(set(got) | {k for k, v in want.items() if v}):
        if got.get(key) is None or round(got[key]) != want.get(key, 0):
            problems.append(f"{title} {key}: Prometheus counted {got.get(key)}, sent "
                            f"{want.get(key, 0)}")
        if want.get(key, 0) and not shown.get(key, 0) > 0:
            problems.append(f"{title} {key}: no rate on the panel during the run for its "
                            f"{want[key]:g} events")
    show = lambda counts: ", ".join(f"{'/'.join(k) or 'all'}={v:g}"  # noqa: E731
                                    for k, v in sorted(counts.items()) if v or not keys)
    return show(got), show(want)


def model_all() -> str:
    """The board's model selector's value for "All"."""
    variables = json.loads(BOARD.read_text())["templating"]["list"]
    return next(v["allValue"] for v in variables if v["name"] == "model")


def legend_of(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), fmt) or "value"


def print_table(rows: list[list[str]]) -> None:
    header = ["panel", "query", "value now (rate: /s)", "counted in the run", "sent"]
    for row in [header] + rows:
        print(" | ".join(row))


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m tools.check_dashboard",
                            description=__doc__.split("\n\n")[0]).parse_args(argv)
    find_prometheus()  # fail before starting anything when it is missing
    with tempfile.TemporaryDirectory(prefix="small-model-") as model:
        config = small_model_config(make_random_model(Path(model), "small"))
        config["applications"][0]["args"]["scheduler"]["max_queue_wait_s"] = MAX_QUEUE_WAIT_S
        return check(config)


def check(config: dict) -> int:
    svc = start_service(config, FAST_METRICS_ENV)
    prom = None
    try:
        problems = check_dashboard_access(svc)
        prom = start_prometheus(svc.session_dir())
        wait_for(lambda: all(t["health"] == "up" for t in prom.targets()) and prom.targets(),
                 "every Ray target up in Prometheus")
        for metric, n in zero_series().items():
            wait_for(lambda metric=metric, n=n: len(prom.query(metric)) >= n,
                     f"{n} series of {metric} scraped")
            if (value := total(prom, metric)) != 0:
                problems.append(f"{metric} is {value} before any traffic")
        print(f"before traffic: every counter series the board plots exists at 0 "
              f"({sum(zero_series().values())} series)")
        time.sleep(2)  # more scrapes at 0: the run's window starts on one
        started = time.time() - 1
        metrics_url = svc.metrics_url()
        traffic = asyncio.run(send_traffic(svc.url, metrics_url))
        problems += traffic.problems
        sent = sum(traffic.answered.values())
        print(f"{sent} requests reached the ingress; statuses by scene (0: hung up): "
              + "; ".join(f"{k} {dict(v)}" for k, v in traffic.scenes.items())
              + f"; items scored {traffic.items_scored}, refused {traffic.refused}, "
              f"shed {traffic.shed}, abandoned {traffic.abandoned}; Serve's back-pressure 503s "
              f"(not sent on) {traffic.serve_refused}")

        def counted() -> tuple[float, float, float]:  # requests, items, drops
            return tuple(total(prom, f"sum(ray_ranker_{m}_total)")
                         for m in ("requests", "items_scored", "sequences_dropped"))

        def expected() -> tuple[float, float, float]:
            return sent, traffic.items_scored, service_sample(scrape(metrics_url)).dropped

        wait_for(lambda: counted() == expected(), "every request, item and drop in Prometheus",
                 lambda: f"Prometheus counted (requests, items, drops) {counted()}, sent "
                 f"{expected()}; {traffic.problems}")
        dropped = service_sample(scrape(metrics_url)).dropped
        if not 1 <= dropped <= traffic.abandoned:
            problems.append(f"{dropped} sequences dropped for {traffic.abandoned} abandoned")
        rows, panel_problems = check_panels(prom, traffic, dropped, started, time.time())
        problems += panel_problems
        print_table(rows)
    finally:
        if prom is not None:
            prom.stop()
        stop_service(svc)
    for problem in problems:
        print(f"FAIL: {problem}")
    print("dashboard check: " + ("FAILED" if problems else "every panel OK"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
