"""Overload and cancellation against the real app (`serve run`, small model, one scorer).

Admission control has two layers: the ingress takes at most MAX_ONGOING requests plus
MAX_QUEUED waiting at the HTTP proxy (Serve answers the rest 503 + Retry-After before any of our
code runs), and a scorer refuses jobs that could not start within `max_queue_wait_s` (503 from
the ingress).
API keys are on (read from an environment variable, auth.api_keys_env): every request sends one,
so the key check is part of the load measured here.
"""

import asyncio
import secrets
import time

import aiohttp
import httpx
import pytest

import tools.service as tooling
from tests.support.service import lines_containing, replica_processes
from tools.http_client import make_session
from tools.loadgen import RateConfig, run_rate
from tools.prom import scrape, service_sample
from tools.workload import RequestFactory, Workload

pytestmark = pytest.mark.service  # starts Ray (the slow tier)

MAX_ONGOING, MAX_QUEUED = 12, 4
SMALL = Workload(query_len=40, items=4, item_len=40, vocab=49152)  # ~200 tokens, one sequence
# ~1,650 tokens, two sequences (max_seq_tokens 1024): ~0.4 s of scorer work each
LARGE = Workload(query_len=40, items=8, item_len=200, vocab=49152)
PHASE_S = 20
BURST_SPACING_S = 0.05  # test_shed_requests_get_retry_after_quickly
KEYS_ENV = "RANKER_TEST_API_KEYS"
API_KEY = f"rk-load-{secrets.token_urlsafe(24)}"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
LATENCY_MARGIN = 2.5  # see test_three_times_capacity_sheds_503s_and_keeps_p99_bounded
GOODPUT_MARGIN = 0.6


@pytest.fixture(scope="module")
def service(small_model):
    config = tooling.small_model_config(small_model)
    # the six fills of the drop scene (~10k tokens, ~5 s of work) start within the bound
    config["applications"][0]["args"]["scheduler"]["max_queue_wait_s"] = 10
    config["applications"][0]["args"]["auth"] = {"api_keys_env": KEYS_ENV}
    tooling.deployment(config, "ScoreIngress").update(
        max_ongoing_requests=MAX_ONGOING, max_queued_requests=MAX_QUEUED,
        backpressure_config={"status_code": 503, "retry_after_s": 1})
    keys = f"load:{API_KEY},other:{secrets.token_urlsafe(24)}"  # entries: comma-separated
    with tooling.serving(config, {**tooling.FAST_METRICS_ENV, KEYS_ENV: keys}) as svc:
        yield svc


def _quiet(svc) -> bool:
    """Scorer queue empty and its counters steady for 2 s: everything sent is done and counted
    (metrics reach Prometheus about a second late)."""
    first = service_sample(scrape(svc.metrics_url()))
    time.sleep(2)
    second = service_sample(scrape(svc.metrics_url()))
    return (second.queued_tokens == second.inflight_tokens == 0
            and (first.items_scored, first.dropped) == (second.items_scored, second.dropped))


def _cancelled(svc) -> dict[str, float]:
    """The ingress's count of cancelled requests, by status (one status: 408)."""
    counts: dict[str, float] = {}
    for name, labels, value in scrape(svc.metrics_url()):
        if name == "ray_ranker_errors_total" and labels.get("error_type") == "Cancelled":
            counts[labels["status"]] = counts.get(labels["status"], 0.0) + value
    return counts


def _refusal_lines(svc) -> int:
    """Log lines of refusals: Serve's access line of a scorer's 503, the proxy's own refusal."""
    return sum("POST /v1/score 503" in line or "dropped due to backpressure" in line
               for line in svc.log.splitlines())


def _rss_mb(svc) -> float:
    procs = replica_processes(svc, "ScoreWorker") + replica_processes(svc, "ScoreIngress")
    return sum(p.memory_info().rss for p in procs) / 2**20


async def _phase(url: str, rate: float, seed: str) -> dict:
    async with make_session(AUTH) as session:
        point, _ = await run_rate(session, url, SMALL, RateConfig(rate=rate, duration_s=PHASE_S,
                                                                  warmup_s=3, seed=seed),
                                  progress=False)
    return point


def test_three_times_capacity_sheds_503s_and_keeps_p99_bounded(service):
    # Capacity: what the service answers when offered far more than it can do.
    probe = asyncio.run(_phase(service.url, 60, "probe"))
    capacity = probe["achieved_rps"]
    assert capacity > 3, probe
    rss_before = _rss_mb(service)
    at_capacity = asyncio.run(_phase(service.url, capacity, "capacity"))
    overload = asyncio.run(_phase(service.url, 3 * capacity, "overload"))
    rss_after = _rss_mb(service)
    in_service_bound_ms = 1e3 * (MAX_ONGOING + MAX_QUEUED) / overload["achieved_rps"]
    p99_3x = overload["latency_ms"]["p99"]
    print(f"\ncapacity {capacity} req/s; at capacity: {at_capacity}\n3x: {overload}\n"
          f"replica RSS {rss_before:.0f} -> {rss_after:.0f} MB; goodput at 3x / capacity "
          f"{overload['achieved_rps'] / capacity:.3f}; P99 at 3x / P99 at capacity "
          f"{p99_3x / at_capacity['latency_ms']['p99']:.2f}; P99 at 3x / in-service bound "
          f"{p99_3x / in_service_bound_ms:.2f}")
    for point in (at_capacity, overload):
        assert set(point["failures"]) <= {"503"}, point  # shed, never 500s or timeouts
    shed = overload["failures"].get("503", 0) / overload["measured_requests"]
    assert shed >= 0.4, overload  # about 2/3 of a 3x load cannot be served
    # Accepted requests keep their latency: admission lets at most MAX_ONGOING + MAX_QUEUED
    # requests into the service, so one waits behind at most that many, each taking about
    # 1 / goodput. Ratios measured on the 2-core CI machine (P99 over that bound): 1.20 and
    # 1.36 (busy); LATENCY_MARGIN leaves ~1.8x room over the worst. The figure the issue
    # tracks, P99 at 3x over P99 at capacity, is printed above and benchmarked on the GPU.
    assert p99_3x <= LATENCY_MARGIN * in_service_bound_ms, overload
    # The service keeps its throughput. Goodput at 3x over the probe's, measured on the CI
    # machine: 1.03, 0.785 (another CPU job running); the load generator and Serve's proxy
    # share its 2 cores with the scorer, and refusing 2/3 of a 3x load costs them CPU.
    assert overload["achieved_rps"] >= GOODPUT_MARGIN * capacity, overload
    assert rss_after - rss_before < 100  # no queue grows without bound
    assert httpx.get(f"{service.url}/health", timeout=10).status_code == 200


def test_shed_requests_get_retry_after_quickly(service):
    lines_before = _refusal_lines(service)

    async def burst() -> list[tuple[int, str | None, float, float]]:
        """60 within 3 s: (status, Retry-After, seconds to the answer, when it was sent).
        Serve's proxy checks a request against max_queued_requests before it counts it as
        queued, so requests arriving at the same instant can all pass the check: sent at once,
        9 more than MAX_ONGOING + MAX_QUEUED were admitted in CI. 50 ms apart, each is checked
        after the ones before it are counted."""
        factory = RequestFactory(LARGE, "burst")  # slow enough that few end mid-burst
        async with aiohttp.ClientSession(headers=AUTH) as session:
            async def one(delay: float):
                await asyncio.sleep(delay)
                loop = asyncio.get_running_loop()
                started = loop.time()
                async with session.post(f"{service.url}/v1/score", data=factory.next_bytes(),
                                        headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    return r.status, r.headers.get("Retry-After"), loop.time() - started, started
            return await asyncio.gather(*(one(BURST_SPACING_S * k) for k in range(60)))

    results = asyncio.run(burst())
    shed = [r for r in results if r[0] == 503]
    served = sorted(r[2] for r in results if r[0] == 200)
    assert {r[0] for r in results} <= {200, 503}
    # Serve lets MAX_ONGOING + MAX_QUEUED in; a request that ends while the burst still arrives
    # frees a place for one more. The arrivals are taken to end by the later of the last send
    # and the last refusal's answer: each request answered 200 before then, or within the
    # 0.1 s an answer may take to reach us after its place was freed, may have let one more in.
    arrived_by = max([r[3] for r in results] + [r[3] + r[2] for r in shed]) + 0.1
    freed = sum(1 for r in results if r[0] == 200 and r[3] + r[2] < arrived_by)
    print(f"\nburst: {len(shed)} refused, {len(results) - len(shed)} admitted, {freed} "
          "answered while it arrived")
    assert len(shed) >= 60 - MAX_ONGOING - MAX_QUEUED - freed, (len(shed), freed)
    assert all(r[1] == "1" for r in shed)
    # Refused at once, not after waiting for capacity: every refusal is back before half of
    # the accepted requests are (those queue behind each other on the one scorer).
    assert served and max(r[2] for r in shed) < served[len(served) // 2], (shed, served)
    # Each refusal is logged as one line, never with a traceback (logs reach serve run's
    # output a little late).
    tooling.wait_until(lambda: _refusal_lines(service) - lines_before >= len(shed), 30,
                       "a log line per refusal", service)
    assert "Traceback" not in service.log


def test_requests_whose_client_left_are_not_computed(service):
    """Large requests fill the scorer's queue; then small ones are abandoned while queued:
    by a client timeout (disconnect) and by Serve's per-request timeout (408)."""
    url = f"{service.url}/v1/score"

    tooling.wait_until(lambda: _quiet(service), 60, "scorer quiet before the test", service)
    before = service_sample(scrape(service.metrics_url()))
    cancelled_before = _cancelled(service)

    async def scenario() -> tuple[list[int], int]:
        large, small = RequestFactory(LARGE, "fill"), RequestFactory(SMALL, "gone")
        async with aiohttp.ClientSession(headers=AUTH) as session:
            async def post(body: bytes, timeout_s: float = 60, headers=None) -> int:
                try:
                    async with session.post(url, data=body, timeout=aiohttp.ClientTimeout(
                            total=timeout_s), headers={"Content-Type": "application/json",
                                                       **(headers or {})}) as r:
                        await r.read()
                        return r.status
                except TimeoutError:
                    return 0  # we hung up
            fill = [asyncio.create_task(post(large.next_bytes())) for _ in range(6)]
            await asyncio.sleep(0.3)  # the scorer is busy with the large ones
            gone = [post(small.next_bytes(), timeout_s=0.3) for _ in range(3)]
            timed = [post(small.next_bytes(), headers={"x-request-timeout-seconds": "0.3"})
                     for _ in range(3)]
            abandoned = await asyncio.gather(*gone, *timed)
            return abandoned, await asyncio.gather(*fill)

    abandoned, filled = asyncio.run(scenario())
    # Hung up (0) or timed out at the proxy (408); a 503 means it was refused, never queued.
    assert abandoned[:3] == [0, 0, 0] and set(abandoned[3:]) <= {408, 503}
    # A fill may be refused (503): Serve's proxy counts requests not yet routed to the ingress
    # against max_queued_requests, and six arrive at once.
    assert set(filled) <= {200, 503} and filled.count(200) >= 3
    queued_then_abandoned = sum(status != 503 for status in abandoned)

    tooling.wait_until(lambda: _quiet(service), 30, "scorer quiet with the drops counted", service)
    after = service_sample(scrape(service.metrics_url()))
    dropped = after.dropped - before.dropped
    scored = sum(after.items_scored.values()) - sum(before.items_scored.values())
    print(f"\nabandoned {abandoned}, fills {filled}, dropped {dropped}, items scored {scored}, "
          f"refused by the scorer {after.rejected - before.rejected}")
    # No abandoned request was computed: only the fills' items were scored. Each abandoned one
    # was cancelled before it reached the scorer or dropped from its queue (at least one was).
    assert scored == filled.count(200) * LARGE.items
    assert 1 <= dropped <= queued_then_abandoned
    # The ingress counts a request abandoned while in its hands with the status the client
    # and Serve give a timeout, 408, whether its client hung up or timed out: every dropped
    # sequence was such a request, and one refused (503) was not cancelled.
    tooling.wait_until(
        lambda: _cancelled(service).get("408", 0) - cancelled_before["408"] >= dropped,
        30, "the cancellations counted", service)
    cancelled = _cancelled(service)
    assert set(cancelled) == {"408"}, cancelled
    assert cancelled["408"] - cancelled_before["408"] <= queued_then_abandoned


# ~8,000 tokens in sequences of max_seq_tokens 1024: one sequence per batch (max_batch_tokens
# 1024), several seconds of scorer work in all
LONG = Workload(query_len=40, items=38, item_len=200, vocab=49152)


def test_a_started_request_whose_deadline_passed_is_not_computed_further(service):
    """A request of many sequences whose deadline passes while its first ones are computed: its
    later sequences are dropped between forwards, so the next request is not held behind them."""
    url = f"{service.url}/v1/score"
    tooling.wait_until(lambda: _quiet(service), 60, "scorer quiet before the test", service)
    before = service_sample(scrape(service.metrics_url()))
    body = RequestFactory(LONG, "expired").next_bytes()
    headers = {**AUTH, "Content-Type": "application/json"}
    with httpx.Client(timeout=60) as client:
        expired = client.post(url, content=body,
                              headers={**headers, "x-request-timeout-seconds": "0.5"})
        started = time.monotonic()
        after_it = client.post(url, content=RequestFactory(SMALL, "next").next_bytes(),
                               headers=headers)
        waited = time.monotonic() - started
    assert expired.status_code == 408, expired.text
    assert after_it.status_code == 200, after_it.text
    tooling.wait_until(lambda: _quiet(service), 30, "scorer quiet with the drops counted", service)
    after = service_sample(scrape(service.metrics_url()))
    scored = sum(after.items_scored.values()) - sum(before.items_scored.values())
    dropped = after.dropped - before.dropped
    print(f"\nexpired: {scored - SMALL.items} of {LONG.items} items computed, {dropped} "
          f"sequences dropped; the next request answered in {waited:.2f} s")
    assert dropped >= 1  # its later sequences were dropped unscored...
    assert scored - SMALL.items < LONG.items  # ...so not all of its items were computed


def test_no_log_line_holds_the_key(service):
    # Read from the environment: Ray's logs of the raylet and workers must not show it either.
    assert lines_containing(service, [API_KEY]) == []
