"""Admission sized from the running scorer replicas (serve_app/admission.py), and the ingress
answering 503 past its share before any work (serve_app/ingress.py, ScoreIngress._admit)."""

import asyncio
from types import SimpleNamespace

import pytest

from serve_app.admission import Admission, ReplicaCounts
from serve_app.ingress import ScoreIngress, ScorerWatch
from serve_app.protocol import ApiError


def test_each_ingress_replica_admits_its_share_of_the_running_scorers():
    counts = ReplicaCounts(scorers=1, ingresses=4)
    admission = Admission(80, counts)
    assert admission.limit() == 20
    counts.scorers = 2  # the autoscaler added a scorer: every ingress admits more
    assert admission.limit() == 40
    counts.ingresses = 3  # shares round up: the service admits at least 80 per scorer
    assert admission.limit() == 54
    counts.scorers = 0  # none running: one request still gets through to be told why
    assert admission.limit() == 1


def test_a_request_past_the_limit_is_refused_until_one_leaves():
    admission = Admission(2, ReplicaCounts(scorers=1, ingresses=1))
    assert admission.try_enter() and admission.try_enter()
    assert not admission.try_enter()
    admission.leave()
    assert admission.try_enter()


class _Watch:
    def __init__(self) -> None:
        self.counts = ReplicaCounts(scorers=1, ingresses=2)
        self.refreshes = 0

    def refresh_soon(self) -> None:
        self.refreshes += 1


def test_the_ingress_answers_503_past_its_share_and_follows_the_counts():
    watch = _Watch()
    ingress = SimpleNamespace(scorers=watch, admission=Admission(4, watch.counts))
    admit = ScoreIngress.func_or_class._admit
    assert admit(ingress) and admit(ingress)  # 4 per scorer, 2 ingress replicas: 2 each
    with pytest.raises(ApiError) as refused:
        admit(ingress)
    assert refused.value.status == 503 and refused.value.headers == {"Retry-After": "1"}
    assert "admission" in refused.value.envelope()["error"]["message"]
    watch.counts.scorers = 2  # a second scorer is RUNNING: room for two more
    assert admit(ingress) and admit(ingress)
    assert watch.refreshes == 5  # every request asks for fresh counts (at most 1/s is asked)
    assert admit(SimpleNamespace(scorers=watch, admission=None)) is False  # off: no slot held


def test_the_watch_reads_both_deployments_and_keeps_the_last_counts_on_failure(monkeypatch):
    worker = SimpleNamespace(app_name="score", deployment_name="ScoreWorker")
    watch = ScorerWatch(worker, "ScoreIngress")
    admission = Admission(80, watch.counts)

    def status(scorers, ingresses):
        deployments = {"ScoreWorker": SimpleNamespace(replica_states={"RUNNING": scorers}),
                       "ScoreIngress": SimpleNamespace(replica_states={"RUNNING": ingresses,
                                                                       "STARTING": 1})}
        return SimpleNamespace(applications={"score": SimpleNamespace(deployments=deployments)})

    monkeypatch.setattr("serve_app.ingress.serve.status", lambda: status(2, 4))
    assert asyncio.run(watch.any_running())
    assert (watch.counts.scorers, watch.counts.ingresses) == (2, 4)
    assert admission.limit() == 40  # the admission reads the same counts

    def unreachable():
        raise ConnectionError("controller gone")

    monkeypatch.setattr("serve_app.ingress.serve.status", unreachable)
    monkeypatch.setattr("serve_app.ingress.SCORER_CHECK_S", 0.0)
    assert asyncio.run(watch.any_running())  # not known: never refused on a guess
    assert (watch.counts.scorers, watch.counts.ingresses) == (2, 4)
    monkeypatch.setattr("serve_app.ingress.serve.status", lambda: status(0, 4))
    assert not asyncio.run(watch.any_running())


@pytest.mark.service  # starts Ray (the slow tier)
def test_a_served_ingress_refuses_past_its_share_before_any_work(small_model):
    """One ingress replica, one scorer, one request per scorer: with the scorer replica's process
    stopped (SIGSTOP), the first request to reach the ingress stays in flight for sure, so the
    other is refused at once with the admission's 503; once the scorer goes on, both kinds of
    request are answered again."""
    import os
    import signal

    import httpx

    import tools.service as tooling
    from tests.support.service import replica_processes

    config = tooling.small_model_config(small_model)
    config["applications"][0]["args"]["admission"] = {"requests_per_scorer": 1}
    svc = tooling.start_service(config)
    body = {"query": [1, 2, 3], "items": [[4, 5], [6]], "label_token_ids": [7, 8]}
    try:
        (scorer,) = replica_processes(svc, "ScoreWorker")

        async def two_while_stopped() -> tuple[httpx.Response, list[httpx.Response]]:
            async with httpx.AsyncClient(base_url=svc.url, timeout=60) as client:
                sent = [asyncio.ensure_future(client.post("/v1/score", json=body))
                        for _ in range(2)]
                done, _ = await asyncio.wait(sent, return_when=asyncio.FIRST_COMPLETED)
                refused = next(iter(done)).result()  # answered while the scorer is stopped
                os.kill(scorer.pid, signal.SIGCONT)
                return refused, await asyncio.gather(*sent)

        os.kill(scorer.pid, signal.SIGSTOP)
        try:
            refused, both = asyncio.run(two_while_stopped())
        finally:
            os.kill(scorer.pid, signal.SIGCONT)
        assert refused.status_code == 503, refused.text
        assert "admission" in refused.json()["error"]["message"]
        assert refused.headers["Retry-After"] == "1"
        assert sorted(r.status_code for r in both) == [200, 503]
        assert httpx.post(f"{svc.url}/v1/score", json=body, timeout=60).status_code == 200
    finally:
        tooling.stop_service(svc)


def test_the_watch_asks_for_the_ingress_deployment_by_its_name():
    from serve_app.ingress import INGRESS_DEPLOYMENT

    assert ScoreIngress.name == INGRESS_DEPLOYMENT
