"""The open-loop load generator (tools/loadgen.py): its statistics and arrival schedules on
hand-made numbers, then short runs against the real service (`serve run configs/score.yaml`)."""

import asyncio
import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from tools import loadgen, ramp
from tools.http_client import API_KEY_ENV, make_session
from tools.prom import ServiceSample, imbalance, scorer_balance
from tools.stats import (
    Outcome,
    aggregate,
    client_behind,
    parse_server_timing,
    passes,
    percentile,
    pick_best,
    summarize_ms,
)
from tools.workload import PRESETS, RequestFactory, Workload, arrival_offsets

# SmolLM2-135M: vocabulary 49152, " Yes"/" No"-like labels; a tiny workload so CPU keeps up.
SMOL = ["--vocab", "49152", "--labels", "10539,5230", "--query-len", "16", "--items", "3",
        "--item-len", "8", "--no-progress"]
POINT_FIELDS = {"offered_rps", "offered_items_per_s", "scheduled_rps", "achieved_rps",
                "achieved_items_per_s", "window_s", "sent", "warmup_requests",
                "measured_requests", "successes", "failed", "failures", "latency_ms",
                "refusal_latency_ms", "send_lag_ms", "on_time_share", "behind_schedule",
                "stages_ms"}
LATENCY_FIELDS = {"p50", "p90", "p99", "max", "mean"}


# ---- statistics on hand-made numbers ---------------------------------------------------------

def test_percentile_is_nearest_rank():
    values = list(range(100, 0, -1))  # 1..100, unsorted
    assert [percentile(values, p) for p in (50, 90, 99, 100)] == [50, 90, 99, 100]
    assert percentile([1, 2, 3, 4], 50) == 2 and percentile([1, 2, 3, 4], 51) == 3
    assert percentile([7.5], 99) == 7.5
    assert percentile([], 50) is None
    assert summarize_ms([0.010, 0.040, 0.020, 0.030]) == {
        "p50": 20.0, "p90": 40.0, "p99": 40.0, "max": 40.0, "mean": 25.0}
    assert summarize_ms([]) == dict.fromkeys(LATENCY_FIELDS)


def test_aggregate_window_failures_and_throughput():
    # warm-up 1 s, window [1, 3), 10 items per request, offered 3 req/s
    outcomes = [
        Outcome(0.5, 0.5, 0.6, "ok"),        # warm-up, done before the window: nowhere
        Outcome(0.9, 0.9, 1.2, "ok"),        # warm-up, done in the window: throughput only
        Outcome(1.0, 1.002, 1.1, "ok"),      # 100 ms
        Outcome(1.5, 1.5, 1.8, "ok"),        # 300 ms
        Outcome(2.0, 2.0, 2.2, "503"),
        Outcome(2.5, 2.5, 3.5, "timeout"),
        Outcome(2.9, 2.9, 3.3, "ok"),        # 400 ms, done after the window: latency only
    ]
    p = aggregate(outcomes, warmup_s=1.0, duration_s=2.0, items_per_request=10, offered_rps=3.0)
    assert set(p) == POINT_FIELDS
    assert (p["offered_rps"], p["offered_items_per_s"]) == (3.0, 30.0)
    assert (p["sent"], p["warmup_requests"], p["measured_requests"]) == (7, 2, 5)
    assert p["scheduled_rps"] == 2.5
    assert (p["successes"], p["failed"], p["failures"]) == (3, 2, {"503": 1, "timeout": 1})
    assert p["latency_ms"] == {"p50": 300.0, "p90": 400.0, "p99": 400.0, "max": 400.0,
                               "mean": 266.667}
    assert p["send_lag_ms"]["max"] == 2.0
    assert p["refusal_latency_ms"]["max"] == 200.0  # the one 503: scheduled 2.0, answered 2.2
    # completed successes in [1, 3): the ones done at 1.2, 1.1 and 1.8
    assert (p["achieved_rps"], p["achieved_items_per_s"]) == (1.5, 15.0)
    assert not passes(p, 10_000)  # failures disqualify
    assert p["on_time_share"] == 1.0 and not p["behind_schedule"]  # 2 ms late is on time
    assert p["stages_ms"] == {}  # no response carried Server-Timing


def test_client_behind_needs_a_backlog_not_a_late_request():
    # 0.15 req/s for 60 s, one send 13 ms late: jitter, not a client out of capacity
    assert not client_behind([0.001] * 8 + [0.013], rate=0.15)
    # 100 req/s, 2 of 100 sends 50 ms late (a stalled loop): under the 100 ms floor
    assert not client_behind([0.05, 0.05] + [0.001] * 98, rate=100)
    # 2 req/s, p99 300 ms: over the floor but under the 500 ms gap, so no backlog
    assert not client_behind([0.3] + [0.001] * 9, rate=2)
    # the same lags at 20 req/s (a 50 ms gap): behind
    assert client_behind([0.3] + [0.001] * 9, rate=20)
    # 100 req/s offered by a client that sends 60 a second: the lag grows to 1.3 s in 2 s
    assert client_behind([i * (1 / 60 - 1 / 100) for i in range(200)], rate=100)
    assert not client_behind([], rate=100)  # nothing measured


def test_a_client_behind_its_schedule_is_flagged():
    # 100 measured requests at 100 req/s, the last 5 sent 0.2 s late: p99 lag 200 ms
    outcomes = [Outcome(1 + i / 100, 1 + i / 100 + (0.2 if i >= 95 else 0.001), 1.5 + i / 100,
                        "ok") for i in range(100)]
    p = aggregate(outcomes, warmup_s=1.0, duration_s=1.0, items_per_request=1, offered_rps=100)
    assert p["on_time_share"] == 0.95 and p["behind_schedule"]
    assert "CLIENT BEHIND: send lag p99 200 ms, 5.0% sent late" in loadgen.format_point(p)
    # 9 requests at 0.15 req/s, one sent 13 ms late: 89% on time, yet not behind
    slow = [Outcome(i / 0.15, i / 0.15 + (0.013 if i == 4 else 0.001), i / 0.15 + 1, "ok")
            for i in range(9)]
    p = aggregate(slow, warmup_s=0.0, duration_s=60.0, items_per_request=1, offered_rps=0.15)
    assert p["on_time_share"] == 0.889 and not p["behind_schedule"]
    assert "CLIENT BEHIND" not in loadgen.format_point(p)


def test_server_timing_stages_and_the_time_outside_the_ingress():
    header = "parse;dur=0.50, tokenize;dur=2.00, queue;dur=30.00, ingress;dur=40.00"
    assert parse_server_timing(header) == {"parse": 0.5, "tokenize": 2.0, "queue": 30.0,
                                           "ingress": 40.0}
    assert parse_server_timing(None) is None and parse_server_timing("x;desc=y") is None
    stages = parse_server_timing(header)
    # client latencies 100 and 60 ms, of which the ingress took 40: 60 and 20 ms outside it
    outcomes = [Outcome(1.0, 1.0, 1.1, "ok", stages), Outcome(1.2, 1.2, 1.26, "ok", stages),
                Outcome(1.3, 1.3, 1.4, "503", stages)]  # a refusal is not timed
    p = aggregate(outcomes, warmup_s=1.0, duration_s=1.0, items_per_request=1, offered_rps=3)
    assert p["stages_ms"]["queue"]["p50"] == 30.0
    assert p["stages_ms"]["outside"]["p50"] == pytest.approx(20.0, abs=1e-6)
    assert p["stages_ms"]["outside"]["p99"] == pytest.approx(60.0, abs=1e-6)


def test_scorer_balance_from_per_replica_samples():
    def sample(a_queued, b_queued, a_items, b_items):
        return ServiceSample(queued_by_replica={"a": a_queued, "b": b_queued},
                             inflight_by_replica={"a": 1000.0, "b": 1000.0},
                             items_scored={"a": a_items, "b": b_items})

    assert (sample(3000, 1000, 0, 0).queued_tokens, sample(3000, 1000, 0, 0).inflight_tokens) \
        == (4000, 2000)  # summed over the replicas
    balance = scorer_balance([sample(3000, 1000, 0, 0), sample(1000, 1000, 60, 40)])
    # mean queued a 2000, b 1000: max 2000 / mean 1500; outstanding 3000 / 2000 -> 3000 / 2500
    assert balance["imbalance_queued_tokens"] == pytest.approx(1.333, abs=1e-3)
    assert balance["imbalance_outstanding_tokens"] == pytest.approx(1.2, abs=1e-3)
    assert balance["imbalance_items"] == pytest.approx(1.2, abs=1e-3)  # 60 / 50
    assert balance["queued_tokens_timeline"] == [{"a": 3000, "b": 1000}, {"a": 1000, "b": 1000}]
    assert scorer_balance([])["samples"] == 0
    assert imbalance({"a": 0.0, "b": 0.0}) is None  # no load: no ratio


def test_pick_best_respects_bound_and_failures():
    def point(achieved, p99, failed=0, successes=10):
        return {"achieved_items_per_s": achieved, "latency_ms": {"p99": p99},
                "failed": failed, "successes": successes}

    pts = [point(10, 100), point(20, 400), point(30, 600), point(40, 100, failed=1),
           point(50, None, successes=0)]
    assert pick_best(pts, 500) is pts[1]
    assert pick_best(pts, 600) is pts[2]
    assert pick_best(pts, 50) is None


def test_poisson_schedule_mean_gap():
    rate, horizon = 50.0, 400.0
    offsets = arrival_offsets("poisson", rate, horizon, seed=1)
    assert offsets == sorted(offsets) and 0 < offsets[0] and offsets[-1] < horizon
    gaps = [b - a for a, b in zip([0.0] + offsets, offsets)]
    assert len(gaps) > 19_000
    assert math.isclose(statistics.fmean(gaps), 1 / rate, rel_tol=0.02)
    assert math.isclose(statistics.pstdev(gaps), 1 / rate, rel_tol=0.05)  # exponential: sd=mean
    assert arrival_offsets("poisson", rate, 10.0, seed=1) == [t for t in offsets if t < 10.0]
    assert arrival_offsets("poisson", rate, 10.0, seed=2) != arrival_offsets("poisson", rate,
                                                                             10.0, seed=1)


def test_constant_schedule_exact():
    assert arrival_offsets("constant", 4.0, 2.0) == [i / 4 for i in range(8)]
    assert arrival_offsets("constant", 3.0, 1.0) == [0.0, 1 / 3, 2 / 3]
    assert arrival_offsets("constant", 0.5, 5.0) == [0.0, 2.0, 4.0]


def test_request_bodies_are_fresh_token_ids_in_range():
    w = Workload(query_len=16, items=3, item_len=8, labels=(10539, 5230), vocab=49152)
    bodies = [RequestFactory(w, seed=0).body()] + [RequestFactory(w, seed=0).body()]
    assert bodies[0] == bodies[1]  # seeded
    factory = RequestFactory(w, seed=0)
    many = [factory.body() for _ in range(200)]
    assert len({json.dumps(b) for b in many}) == 200
    for b in many:
        assert len(b["query"]) == 16 and len(b["items"]) == 3
        assert all(len(item) == 8 for item in b["items"])
        assert all(0 <= t < 49152 for t in b["query"] + sum(b["items"], []))
        assert b["label_token_ids"] == [10539, 5230]
        assert "model" not in b  # only sent when asked for
    named = replace(w, model="ranker-a")
    assert RequestFactory(named, seed=0).body() == bodies[0] | {"model": "ranker-a"}


@pytest.mark.parametrize("text", [None, "natural"])
def test_a_repeated_query_comes_back_k_times_within_its_window_with_fresh_items(text):
    w = Workload(**PRESETS["profile"], text=text)
    rate = 100.0  # requests/s; window 1 s: a query's repeats within about 100 requests
    factory = RequestFactory(w, seed=0, rate=rate)
    bodies = [factory.body() for _ in range(1000)]
    seen: dict[str, list[int]] = {}
    for i, b in enumerate(bodies):
        seen.setdefault(json.dumps(b["query"]), []).append(i)
    complete = [at for at in seen.values() if at[-1] < 900]  # queries opened well before the end
    assert complete and all(len(at) == 4 for at in complete)
    spans = sorted(at[-1] - at[0] for at in complete)
    assert spans[len(spans) // 2] <= rate * w.repeat_window_s  # median within the window
    items = [json.dumps(item) for b in bodies for item in b["items"]]
    assert len(set(items)) == len(items)  # candidates are never repeated
    standard = RequestFactory(Workload(**PRESETS["standard"]), seed=0, rate=rate)
    assert len({json.dumps(standard.body()["query"]) for _ in range(200)}) == 200


TOKENIZER = Path(__file__).resolve().parents[2] / "models/smollm2-135m-instruct/tokenizer.json"


@pytest.mark.parametrize("mode", ["repeat", "natural"])
def test_text_bodies_are_seeded_strings(mode):
    w = Workload(query_len=30, items=4, item_len=50, labels=(10539, 5230), vocab=49152, text=mode)
    assert w.describe()["text"] == mode
    assert RequestFactory(w, seed=3).body() == RequestFactory(w, seed=3).body()  # seeded
    factory = RequestFactory(w, seed=3)
    many = [factory.body() for _ in range(50)]
    for b in many:
        assert isinstance(b["query"], str) and len(b["items"]) == 4
        assert all(isinstance(item, str) and item for item in b["items"])
        assert b["label_token_ids"] == [10539, 5230]
    distinct = len({json.dumps(b) for b in many})
    # "repeat" is SGLang's fixed text: the same every time; "natural" differs per request.
    assert distinct == (1 if mode == "repeat" else 50)
    if mode == "natural":
        assert RequestFactory(w, seed=4).body() != RequestFactory(w, seed=3).body()


def test_text_token_counts_around_item_len():
    """Through the real tokenizer: "repeat" is exact, "natural" within ±30% of item_len per item
    (its rule draws 0.75..1.25 × item_len words of about one token each) and ±10% on average."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))

    def count(text):
        return len(tok.encode(text, add_special_tokens=False).ids)

    query, items = RequestFactory(Workload(query_len=30, items=3, item_len=50,
                                           text="repeat")).texts()
    assert count(query) == 30 and [count(i) for i in items] == [50, 50, 50]
    item_len = 180
    factory = RequestFactory(Workload(query_len=120, items=10, item_len=item_len,
                                      text="natural"), seed=0)
    counts = [count(item) for _ in range(30) for item in factory.texts()[1]]
    assert all(0.7 * item_len <= c <= 1.3 * item_len for c in counts), (min(counts), max(counts))
    assert abs(statistics.fmean(counts) / item_len - 1) <= 0.1
    assert len(set(counts)) > 10  # lengths vary, not one fixed size


# ---- short runs against the real service -----------------------------------------------------

@pytest.fixture(autouse=True)
def _load_tools_send_a_key(monkeypatch, api_keys):
    # The shared service wants an API key: the load tools read it from $RANKER_API_KEY (client
    # processes inherit it).
    monkeypatch.setenv(API_KEY_ENV, api_keys["team-b"])


def test_run_smoke(server_url, tmp_path):
    """Every request of the schedule is sent, counted in its period and answered. The tool
    waits for every answer, so none of this depends on how fast the machine answers: a slow
    one makes the latency longer, and `achieved_rps` (answers done inside the window) smaller,
    even 0."""
    out = tmp_path / "run.json"
    rate, warmup, duration = 1.5, 2.0, 2.0
    doc = loadgen.main(["run", "--url", server_url, "--rate", str(rate), "--duration",
                        str(duration), "--warmup", str(warmup), "--timeout", "120",
                        "--out", str(out), *SMOL])
    assert json.loads(out.read_text()) == doc
    assert doc["meta"]["model"] == "smollm2-135m-instruct"
    assert doc["config"]["rate"] == rate and doc["config"]["arrival"] == "poisson"
    assert doc["workload"]["tokens_per_request"] == 16 + 3 * 8
    r = doc["result"]
    assert set(r) == POINT_FIELDS | {"client_processes"}  # a run adds how it sent the load
    assert r["client_processes"] == 1  # 1.5 req/s: one process
    # the seeded Poisson schedule (seed 0): some sends in the warm-up, some in the window
    schedule = arrival_offsets("poisson", rate, warmup + duration, 0)
    warm = sum(1 for t in schedule if t < warmup)
    assert 0 < warm < len(schedule)
    assert (r["sent"], r["warmup_requests"], r["measured_requests"]) == (
        len(schedule), warm, len(schedule) - warm)
    assert (r["successes"], r["failed"], r["failures"]) == (r["measured_requests"], 0, {})
    assert r["stages_ms"]["ingress"]["p50"] > 0  # the service's Server-Timing was read
    lat = r["latency_ms"]
    assert set(lat) == LATENCY_FIELDS
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    # achieved: a whole number of answers done in the window, of at most every request sent
    answered_in_window = r["achieved_rps"] * r["window_s"]
    assert r["window_s"] == duration
    assert answered_in_window == pytest.approx(round(answered_in_window), abs=1e-3)
    assert 0 <= round(answered_in_window) <= r["sent"]
    assert r["achieved_items_per_s"] == pytest.approx(3 * r["achieved_rps"], abs=1e-3)


def test_sweep_smoke_writes_plot_and_best_respects_bound(server_url, tmp_path):
    png, bound = tmp_path / "sweep.png", 20_000.0  # generous: 2 shared cores
    doc = loadgen.main(["sweep", "--url", server_url, "--rates", "2,4", "--arrival", "constant",
                        "--duration", "1.5", "--warmup", "0.5", "--cooldown", "0",
                        "--p99-ms", str(bound), "--out", str(tmp_path / "sweep.json"),
                        "--plot", str(png), *SMOL])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert doc["plot"] == str(png) and doc["p99_bound_ms"] == bound
    assert [p["offered_rps"] for p in doc["points"]] == [2.0, 4.0]
    assert [p["measured_requests"] for p in doc["points"]] == [3, 6]  # constant arrivals
    best = doc["best"]
    assert best is not None and best["failed"] == 0 and best["latency_ms"]["p99"] <= bound
    passing = [p for p in doc["points"] if p["passed"]]
    assert best["achieved_items_per_s"] == max(p["achieved_items_per_s"] for p in passing)


def test_overload_smoke_reports_each_multiple(server_url, tmp_path):
    doc = loadgen.main(["overload", "--url", server_url, "--capacity-rps", "2",
                        "--multiples", "1,2", "--arrival", "constant", "--duration", "1.5",
                        "--warmup", "0.5", "--cooldown", "0", "--out",
                        str(tmp_path / "overload.json"), *SMOL])
    assert [p["offered_rps"] for p in doc["points"]] == [2.0, 4.0]
    assert [o["multiple"] for o in doc["overload"]] == [1.0, 2.0]
    first = doc["points"][0]
    assert doc["capacity_items_per_s"] == first["achieved_items_per_s"]
    assert doc["p99_at_capacity_ms"] == first["latency_ms"]["p99"]
    for row, point in zip(doc["overload"], doc["points"]):
        assert row["offered_items_per_s"] == point["offered_items_per_s"]
        assert row["goodput_items_per_s"] == point["achieved_items_per_s"]
        assert row["refused"] == point["failures"].get("503", 0)
        assert row["refusal_p99_ms"] is None if row["refused"] == 0 else row["refusal_p99_ms"] > 0


def test_sweep_from_two_client_processes_sends_the_same_schedule(server_url, tmp_path):
    """--clients 2 splits the rate over two processes; with constant arrivals their send times
    interleave into exactly the one-process schedule, and every request is answered."""
    doc = loadgen.main(["sweep", "--url", server_url, "--rates", "4", "--arrival", "constant",
                        "--clients", "2", "--duration", "1.5", "--warmup", "0.5", "--cooldown",
                        "0", "--out", str(tmp_path / "sweep.json"), "--plot",
                        str(tmp_path / "sweep.png"), *SMOL])
    assert doc["config"]["clients"] == 2
    (point,) = doc["points"]
    assert (point["sent"], point["warmup_requests"], point["measured_requests"]) == (8, 2, 6)
    assert (point["successes"], point["failed"]) == (6, 0)
    assert point["send_lag_ms"]["p99"] < 1000  # both processes sent near their times
    assert point["client_processes"] == 2


def test_client_processes_follow_the_offered_rate():
    assert loadgen.client_processes(loadgen.RateConfig(rate=50)) == 1
    assert loadgen.client_processes(loadgen.RateConfig(rate=450)) == 5
    assert loadgen.client_processes(loadgen.RateConfig(rate=450, clients=2)) == 2


def test_single_smoke(server_url, tmp_path):
    doc = loadgen.main(["single", "--url", server_url, "--requests", "5", "--warmup-requests",
                        "1", "--out", str(tmp_path / "single.json"), *SMOL])
    r = doc["result"]
    assert (r["requests"], r["successes"], r["failed"]) == (5, 5, 0)
    assert 0 < r["latency_ms"]["p50"] <= r["latency_ms"]["p99"] <= r["latency_ms"]["max"]
    # where the idle time goes: the ingress's Server-Timing stages and the time outside it
    assert {"ingress", "outside"} <= r["stages_ms"].keys()
    assert r["stages_ms"]["ingress"]["p50"] <= r["latency_ms"]["p50"]


def test_sporadic_smoke_tells_idle_from_busy_requests(server_url, tmp_path):
    doc = loadgen.main(["sporadic", "--url", server_url, "--rate", "1", "--requests", "4",
                        "--warmup-requests", "1", "--out", str(tmp_path / "sporadic.json"),
                        *SMOL])
    r = doc["result"]
    assert doc["config"]["rate"] == 1.0 and r["failed"] == 0
    assert r["idle"] + r["busy"] == 4  # every measured request, found idle or busy
    # latency_ms holds the requests that found the service idle, and only those
    assert (r["latency_ms"]["p50"] is None) == (r["idle"] == 0)
    assert (r["busy_latency_ms"]["p50"] is None) == (r["busy"] == 0)
    if r["idle"]:
        assert r["idle_before_ms"]["p50"] > 0 and "ingress" in r["stages_ms"]


def test_sporadic_sends_to_each_url_in_turn(server_url):
    async def two():
        async with make_session() as session:
            return await loadgen.run_sporadic(session, [server_url, server_url],
                                              Workload(16, 3, 8, (10539, 5230), 49152),
                                              rate=2, requests=2, warmup_requests=0,
                                              progress=False)

    results = asyncio.run(two())
    assert len(results) == 2
    assert all(r["idle"] + r["busy"] == 2 and r["failed"] == 0 for r in results)


def test_sporadic_sends_each_url_its_own_workload(server_url):
    """A list of workloads, one per URL (the headline's requests with an adapter and without):
    each URL's bodies and expected item counts are its own (a mismatch is a bad response)."""
    async def two():
        async with make_session() as session:
            return await loadgen.run_sporadic(
                session, [server_url, server_url],
                [Workload(16, 3, 8, (10539, 5230), 49152), Workload(16, 2, 8, (10539, 5230),
                                                                    49152)],
                rate=2, requests=2, warmup_requests=0, progress=False)

    results = asyncio.run(two())
    assert [r["idle"] + r["busy"] for r in results] == [2, 2]
    assert [r["failed"] for r in results] == [0, 0]


def test_single_smoke_with_text(server_url, tmp_path):
    doc = loadgen.main(["single", "--url", server_url, "--requests", "3", "--warmup-requests",
                        "0", "--text", "natural", "--out", str(tmp_path / "single.json"), *SMOL])
    assert doc["workload"]["text"] == "natural"
    assert (doc["result"]["successes"], doc["result"]["failed"]) == (3, 0)


def test_single_smoke_with_rerank(server_url, tmp_path):
    doc = loadgen.main(["single", "--url", server_url, "--requests", "3", "--warmup-requests",
                        "0", "--text", "natural", "--rerank", "--out",
                        str(tmp_path / "single.json"), *SMOL])
    assert doc["workload"]["rerank"] is True
    assert (doc["result"]["successes"], doc["result"]["failed"]) == (3, 0)


def test_rerank_workload_needs_text():
    with pytest.raises(ValueError, match="text mode"):
        Workload(rerank=True)
    body = RequestFactory(Workload(query_len=5, items=3, item_len=4, text="natural",
                                   rerank=True)).body()
    assert set(body) == {"query", "documents"} and len(body["documents"]) == 3


def test_ramp_smoke_sends_every_phase(server_url):
    phases = ramp.parse_phases("1:2,1:6")
    w = Workload(query_len=16, items=3, item_len=8, labels=(10539, 5230), vocab=49152)
    outcomes, ticks = asyncio.run(ramp.run_ramp(server_url, w, phases, sample_every_s=0.5))
    assert [o.intended for o in outcomes] == ramp.schedule(phases)
    assert outcomes and all(o.kind == "ok" for o in outcomes)
    assert ticks and all(t.service is None for t in ticks)  # no metrics URL given
    rows = ramp.timeline(outcomes, ticks, phases)
    assert [r["offered_rps"] for r in rows] == [2.0, 6.0, 0.0]
    assert sum(r["sent"] for r in rows) == len(outcomes)
    summary = ramp.summarize(outcomes, rows, phases)
    assert (summary["requests"], summary["failed"]) == (len(outcomes), 0)


def test_ramp_summary_times_the_scale_up_from_the_decision():
    phases = ramp.parse_phases("3:10,3:40")
    rows = [{"t": 0.0, "target_replicas": 1, "serving_replicas": 1},
            {"t": 1.0},  # no Prometheus sample in this window
            {"t": 2.0, "target_replicas": 2, "serving_replicas": 1},
            {"t": 3.0, "target_replicas": 2, "serving_replicas": 1},
            {"t": 4.0},
            {"t": 5.0, "target_replicas": 2, "serving_replicas": 2},
            {"t": 6.0, "target_replicas": 2, "serving_replicas": 2}]
    summary = ramp.summarize([], rows, phases)
    assert summary["second_replica_asked_at_s"] == 2.0
    assert summary["scale_up_s"] == 3.0
    assert summary["second_replica_serving_after_s"] == 2.0  # the peak began at t = 3 s
    assert ramp.summarize([], rows[:4], phases)["scale_up_s"] is None  # never served
