"""Load control at the ingress (docs/ARCHITECTURE.md, "Load control"): shedding before a request
is read while the scorers refuse (serve_app/shedding.py), the scorer check that asks Serve's
controller only for a job that waits, the 503 before the body, and the settings that went away.
The scorer's own bound in tokens and seconds: tests/cpu/test_worker_admission.py."""

import asyncio
import random
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from ranker_contract.config import AppConfig, SchedulerConfig
from ranker_contract.errors import ScorerOverloaded
from ranker_contract.packing import ScoredJob, ScoreJob, pack_plain
from serve_app import shedding
from serve_app.auth import KEY_ID_SCOPE
from serve_app.ingress import ScoreIngress, ScorerWatch
from serve_app.protocol import ApiError
from serve_app.shedding import Shedding


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _answers(shed: Shedding, clock: _Clock, seconds: float, per_s: int, refused_share: float):
    """Scorer answers at `per_s`, `refused_share` of them refusals, for `seconds`."""
    step = 1 / per_s
    for k in range(round(seconds * per_s)):
        clock.now += step
        shed.answered(refused=(k % 10) < refused_share * 10)


def test_free_when_idle_and_below_capacity():
    clock = _Clock()
    shed = Shedding(clock, draw=lambda: 0.0)  # any share above 0 would shed with this draw
    assert not shed.shed()
    _answers(shed, clock, seconds=5, per_s=500, refused_share=0.0)  # busy, nothing refused
    assert shed.share == 0.0 and not shed.shed()


def test_sheds_while_the_scorers_refuse_and_stops_once_they_do_not():
    clock = _Clock()
    shed = Shedding(clock, draw=lambda: 0.5)
    _answers(shed, clock, seconds=2, per_s=200, refused_share=0.6)
    assert 0.5 < shed.share <= shedding.MAX_SHARE and shed.shed()
    _answers(shed, clock, seconds=3, per_s=200, refused_share=0.0)  # DECAY: 0 within 3 s
    assert shed.share == 0.0 and not shed.shed()


def test_the_share_never_passes_its_cap_and_ends_when_answers_stop():
    clock = _Clock()
    shed = Shedding(clock, draw=lambda: 0.0)
    _answers(shed, clock, seconds=5, per_s=200, refused_share=1.0)
    assert shed.share == shedding.MAX_SHARE
    clock.now += shedding.WINDOW_S + 0.01  # no answer since: the overload is over
    assert not shed.shed() and shed.share == 0.0


def _simulate(offered: float, capacity: float, seconds: float = 20.0, dt: float = 0.005,
              bound_s: float = 0.5, seed: int = 0) -> dict:
    """One ingress in front of scorers that compute `capacity` requests/s and refuse a job that
    could not start within `bound_s` (gpu_worker/serving/scheduler.py), offered `offered`
    requests/s: what was shed, sent and computed per second over the second half."""
    clock, rng = _Clock(), random.Random(seed)
    shed = Shedding(clock, draw=rng.random)
    due = backlog = 0.0
    counts = dict.fromkeys(("shed", "sent", "computed"), 0.0)
    for step in range(round(seconds / dt)):
        clock.now += dt
        measured = step * dt >= seconds / 2
        done = min(backlog, capacity * dt)
        backlog -= done
        counts["computed"] += measured * done
        due += offered * dt
        while due >= 1:
            due -= 1
            if shed.shed():
                counts["shed"] += measured
                continue
            accepted = backlog < capacity * bound_s
            backlog += accepted
            shed.answered(refused=not accepted)
            counts["sent"] += measured
    return {k: v / (seconds / 2) for k, v in counts.items()}


@pytest.mark.parametrize("multiple", [1.2, 1.5, 3.0])
def test_past_capacity_the_scorers_stay_full_and_most_excess_is_shed_unread(multiple):
    capacity = 200.0
    rates = _simulate(multiple * capacity, capacity)
    assert rates["computed"] >= 0.95 * capacity  # goodput: the scorers never starve
    # what still reaches them (read, tokenized, then refused) stays near the target's excess
    assert rates["sent"] <= 1.3 * capacity
    assert rates["shed"] >= multiple * capacity - 1.3 * capacity


def test_it_follows_the_scorers_running():
    # the same offered load against one scorer's capacity, then two's: half the shedding or none
    one, two = _simulate(300.0, 200.0), _simulate(300.0, 400.0)
    assert one["shed"] > 0 and two["shed"] == 0 and two["computed"] >= 0.99 * 300.0


class _Metrics:
    def __init__(self) -> None:
        self.answers = []

    def answered(self, path, status, seconds, error_type, **labels):
        self.answers.append((path, status, error_type))


class _UnreadRequest:
    scope: dict = {}

    async def body(self) -> bytes:
        raise AssertionError("a shed request must not be read")


def test_a_shed_request_is_answered_503_before_its_body_is_read():
    metrics = _Metrics()
    ingress = SimpleNamespace(keys=None, shedding={False: SimpleNamespace(shed=lambda: True)},
                              metrics=metrics)
    observed = ScoreIngress.func_or_class._observed
    with pytest.raises(ApiError) as refused:
        asyncio.run(observed(ingress, "/v1/score", _UnreadRequest()))
    assert refused.value.status == 503 and refused.value.headers == {"Retry-After": "1"}
    assert "shedding" in refused.value.envelope()["error"]["message"]
    assert metrics.answers == [("/v1/score", 503, refused.value.kind)]


class _Worker:
    """A scorer handle whose score() answers `answer` (a ScoredJob, or a ScorerOverloaded)."""

    def __init__(self, answer) -> None:
        self.score = SimpleNamespace(remote=lambda job: self._answer(answer))

    @staticmethod
    async def _answer(answer):
        return answer


def test_every_scorer_answer_feeds_the_shedding():
    seen = []
    job = ScoreJob([pack_plain([3, 4, 5], 0)], [0, 1])
    call = ScoreIngress.func_or_class._call_worker
    for answer in (ScorerOverloaded("full"), "scores"):
        ingress = SimpleNamespace(worker=_Worker(answer), scorers=None, shedding={
            False: SimpleNamespace(answered=lambda refused: seen.append(refused))})
        try:
            asyncio.run(call(ingress, job))
        except ApiError as exc:
            assert exc.status == 503 and "full" in exc.envelope()["error"]["message"]
    assert seen == [True, False]


def test_each_priority_class_is_shed_on_the_refusals_of_its_own_jobs():
    # Past capacity the scorers refuse bulk jobs (their bound counts every token queued) and
    # admit online ones: only bulk requests may then be shed before they are read.
    ingress = SimpleNamespace(shedding={False: Shedding(), True: Shedding()},
                              worker=_Worker(ScorerOverloaded("full")), scorers=None)
    call = ScoreIngress.func_or_class._call_worker
    for _ in range(20):
        with pytest.raises(ApiError):
            asyncio.run(call(ingress, ScoreJob([pack_plain([3, 4], 0)], [0], bulk=True)))
    assert ingress.shedding[True].share > 0 and ingress.shedding[False].share == 0
    ingress.worker = _Worker(ScoredJob([[[0.0]]], queued_s=0.0, computed_s=0.0))
    asyncio.run(call(ingress, ScoreJob([pack_plain([3, 4], 0)], [0])))
    assert ingress.shedding[False].share == 0

    async def pipeline(path, request, started, seen):
        read.append(request.scope[KEY_ID_SCOPE])
        return SimpleNamespace(status_code=200)

    metrics, read = _Metrics(), []
    ingress.shedding[True] = SimpleNamespace(shed=lambda: True)
    ingress.shedding[False] = SimpleNamespace(shed=lambda: False)
    observed = ScoreIngress.func_or_class._observed
    for key_id, status in (("etl", 503), ("web", 200)):
        served = SimpleNamespace(keys=SimpleNamespace(bulk=lambda key: key == "etl"),
                                 shedding=ingress.shedding, metrics=metrics, timeout_s=None,
                                 _pipeline=pipeline)
        request = SimpleNamespace(scope={KEY_ID_SCOPE: key_id}, headers={})
        try:
            assert asyncio.run(observed(served, "/v1/score", request)).status_code == status
        except ApiError as exc:
            assert exc.status == status and "shedding" in exc.message
    assert read == ["web"]  # the bulk request was answered unread
    assert [status for _, status, _ in metrics.answers] == [503, 200]


def test_the_watch_counts_running_scorers_and_never_refuses_on_a_guess(monkeypatch):
    worker = SimpleNamespace(app_name="score", deployment_name="ScoreWorker")
    watch = ScorerWatch(worker)
    asked = []

    def status(running):
        asked.append(running)
        deployments = {"ScoreWorker": SimpleNamespace(replica_states={"RUNNING": running,
                                                                      "STARTING": 1})}
        return SimpleNamespace(applications={"score": SimpleNamespace(deployments=deployments)})

    monkeypatch.setattr("serve_app.ingress.serve.status", lambda: status(2))
    assert asyncio.run(watch.any_running())
    monkeypatch.setattr("serve_app.ingress.serve.status", lambda: status(0))
    assert asyncio.run(watch.any_running())  # asked within SCORER_CHECK_S: the last answer
    assert asked == [2]

    def unreachable():
        raise ConnectionError("controller gone")

    monkeypatch.setattr("serve_app.ingress.SCORER_CHECK_S", 0.0)
    monkeypatch.setattr("serve_app.ingress.serve.status", unreachable)
    assert asyncio.run(watch.any_running())  # not known: never refused on a guess
    monkeypatch.setattr("serve_app.ingress.serve.status", lambda: status(0))
    assert not asyncio.run(watch.any_running())


def test_the_settings_that_went_away_fail_naming_their_replacement():
    with pytest.raises(ValidationError, match="scheduler.max_queue_wait_s"):
        AppConfig.model_validate({"admission": {"requests_per_scorer": 80}})
    with pytest.raises(ValidationError, match="scheduler.max_queue_wait_s"):
        SchedulerConfig.model_validate({"max_queued_tokens": 262144})
    with pytest.raises(ValidationError, match="max_queued_tokens was removed"):
        AppConfig.model_validate({"scheduler": {"max_queued_tokens": 4096}})
