"""/v1/score and /v1|v2/rerank run one ingress pipeline (parse → tokenize → pack → scorer →
merge → respond) and differ only in their route's own steps: each route's answer, Server-Timing
and metrics, on the ingress class without Ray (the scorer's handle is a stand-in)."""

import asyncio
import json
import math
from types import SimpleNamespace

import pytest

from ranker_contract.config import AppConfig
from ranker_contract.errors import ScorerOverloaded
from ranker_contract.packing import ScoredJob
from serve_app.auth import KEY_ID_SCOPE, require_keys
from serve_app.ingress import ScoreIngress
from serve_app.protocol import ApiError
from serve_app.quotas import Quota, Quotas
from serve_app.shedding import Shedding
from tests.support.ledger import FakeLedger

LOGPROBS = [-0.5, -1.5]  # what the stand-in scorer answers for every item
TIMING_PARTS = ["parse", "tokenize", "pack", "quota", "worker", "hop", "queue", "compute",
                "ingress"]


class _Scorer:
    """Stands in for the scorer's DeploymentHandle: `.score.remote(job)` scores every item."""

    app_name, deployment_name = "score", "ScoreWorker"

    def __init__(self) -> None:
        self.score = self
        self.jobs = []

    async def remote(self, job):
        self.jobs.append(job)
        return ScoredJob([[LOGPROBS] * seq.num_items for seq in job.sequences],
                         queued_s=0.001, computed_s=0.002)


class _Metrics:
    def __init__(self) -> None:
        self.answered_as = []
        self.tokenize_ms = SimpleNamespace(observe=lambda ms: self.tokenized.append(ms))
        self.tokenized = []

    def answered(self, route, status, seconds, error_type=None, key="none", model="-",
                 items=0, tokens=0) -> None:
        assert key == "none"  # auth is off: no API key id
        self.answered_as.append((route, status, error_type, model, items))
        self.tokens = tokens


class _Request:
    """Stands in for the HTTP request: the pipeline reads only its body, its headers (the
    deadline's) and the API key id that serve_app/auth.py leaves in its scope (absent here:
    auth off)."""

    def __init__(self, body: dict, headers: dict | None = None) -> None:
        self._body = json.dumps(body).encode()
        self.scope: dict = {}
        self.headers = headers or {}

    async def body(self) -> bytes:
        return self._body


@pytest.fixture(scope="module")
def ingress():
    # The class as written, without Serve's replica wrapper: __init__ loads the default
    # model's tokenizer and builds both routes.
    user_class = ScoreIngress.func_or_class.__bases__[0]
    instance = user_class.__new__(user_class)
    user_class.__init__(instance, _Scorer(), AppConfig())
    return instance


SERVED = AppConfig().served_model_name  # no `model` in a request: the model itself


def _post(ingress, path: str, body: dict, headers: dict | None = None, scorer=None):
    ingress.worker, ingress.metrics = scorer or _Scorer(), _Metrics()
    return asyncio.run(ingress._observed(path, _Request(body, headers)))


def _timing_parts(response) -> list[str]:
    return [part.split(";")[0].strip() for part in response.headers["Server-Timing"].split(",")]


def test_score_with_token_ids(ingress):
    response = _post(ingress, "/v1/score", {"query": [1, 2], "items": [[3], [4, 5]],
                                            "label_token_ids": [7, 8]})
    body = json.loads(response.body)
    assert body["scores"] == [[math.exp(lp) for lp in LOGPROBS]] * 2
    assert body["usage"]["prompt_tokens"] == (2 + 1) + (1 + 1) + (2 + 1)  # Q D, I_1 D, I_2 D
    assert ingress.worker.jobs[0].label_ids == [7, 8]
    assert _timing_parts(response) == TIMING_PARTS
    assert ingress.metrics.answered_as == [("/v1/score", 200, None, SERVED, 2)]
    assert ingress.metrics.tokens == 8  # the key's usage: the response's prompt_tokens
    assert ingress.metrics.tokenized == []  # token ids: nothing tokenized, nothing observed


@pytest.mark.parametrize("path, version", [("/v1/rerank", "1"), ("/v2/rerank", "2")])
def test_rerank_of_text(ingress, path, version):
    response = _post(ingress, path, {"query": "capital of France?",
                                     "documents": ["Paris.", "Bananas."], "top_n": 1})
    body = json.loads(response.body)
    assert body["results"] == [{"index": 0, "relevance_score": 1 / (1 + math.exp(-1.0))}]
    assert body["meta"]["api_version"] == {"version": version}
    prompter = ingress.models.main.rerank[version].prompter
    assert ingress.worker.jobs[0].label_ids == prompter.label_ids
    assert _timing_parts(response) == TIMING_PARTS
    assert ingress.metrics.answered_as == [(path, 200, None, SERVED, 2)]
    assert len(ingress.metrics.tokenized) == 1


@pytest.mark.parametrize("path, body, param", [
    ("/v1/score", {"query": [1], "items": [[2] * 8192], "label_token_ids": [7]}, "items[0]"),
    # a rerank document too long is scored in chunks; its query has a limit
    ("/v2/rerank", {"query": "word " * 3000, "documents": ["ok"]}, "query"),
], ids=["score", "rerank"])
def test_a_part_too_long_is_named_as_its_route_calls_it(ingress, path, body, param):
    with pytest.raises(ApiError) as caught:
        _post(ingress, path, body)
    assert caught.value.status == 400 and caught.value.param == param
    # refused after its model was read: counted under it, no items
    assert ingress.metrics.answered_as == [(path, 400, "BadRequestError", SERVED, 0)]
    assert ingress.worker.jobs == []  # refused before the scorer


def test_a_request_refused_before_its_model_is_known_is_counted_under_no_model(ingress):
    with pytest.raises(ApiError) as caught:
        _post(ingress, "/v1/score", {"query": [1], "items": "not a list"})
    assert caught.value.status == 400
    assert ingress.metrics.answered_as == [("/v1/score", 400, "BadRequestError", "-", 0)]


class _SlowScorer(_Scorer):
    """Answers after `seconds`; records whether the job's call was cancelled instead. Its
    remote() returns a task: what the ingress awaits and cancels, as a DeploymentResponse."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds, self.cancelled = seconds, False

    def remote(self, job):
        return asyncio.ensure_future(self._score(job))

    async def _score(self, job):
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return await super().remote(job)


SCORE_BODY = {"query": [1, 2], "items": [[3], [4, 5]], "label_token_ids": [7, 8]}


@pytest.mark.parametrize("default_s, headers", [
    (None, {"x-request-timeout-seconds": "0.5"}),  # the header's deadline
    (0.5, {}),  # Serve's request_timeout_s
    (0.5, {"x-request-timeout-seconds": "nonsense"}),  # not a number: Serve's, as Serve does
], ids=["header", "config", "malformed-header"])
def test_a_deadline_passed_answers_408_in_the_envelope_and_cancels_the_job(
        ingress, monkeypatch, default_s, headers):
    monkeypatch.setattr(ingress, "timeout_s", default_s)
    scorer = _SlowScorer(seconds=60)
    with pytest.raises(ApiError) as caught:
        _post(ingress, "/v1/score", SCORE_BODY, headers, scorer)
    error = caught.value.envelope()["error"]
    assert caught.value.status == 408 and error["type"] == "RequestTimeoutError"
    assert "0.5 s" in error["message"] and "x-request-timeout-seconds" in error["message"]
    assert scorer.cancelled and scorer.jobs == []  # never scored
    # counted as a cancelled request, as one whose client left
    assert ingress.metrics.answered_as == [("/v1/score", 408, "Cancelled", SERVED, 0)]


def test_a_header_of_0_lifts_the_deadline(ingress, monkeypatch):
    monkeypatch.setattr(ingress, "timeout_s", 0.1)
    response = _post(ingress, "/v1/score", SCORE_BODY, {"x-request-timeout-seconds": "0"},
                     _SlowScorer(seconds=0.5))
    assert response.status_code == 200


def _calibrated_ingress(tmp_path, maps: dict):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"models": {name: {"calibration": m} for name, m in maps.items()}}))
    user_class = ScoreIngress.func_or_class.__bases__[0]
    instance = user_class.__new__(user_class)
    user_class.__init__(instance, _Scorer(), AppConfig(calibration=str(path)))
    return instance


def test_a_calibrated_model_answers_its_map_of_the_relevance_and_the_raw_one(tmp_path):
    ingress = _calibrated_ingress(tmp_path, {SERVED: {"method": "platt", "a": 2.0, "b": 1.0}})
    body = json.loads(_post(ingress, "/v2/rerank", {"query": "q?",
                                                    "documents": ["a", "b"]}).body)
    raw = 1 / (1 + math.exp(-1.0))  # the stand-in's P(yes) / (P(yes) + P(no)): log-odds 1.0
    calibrated = 1 / (1 + math.exp(-(2.0 * 1.0 + 1.0)))
    assert [(r["relevance_score"], r["raw_score"]) for r in body["results"]] == [
        (pytest.approx(calibrated), pytest.approx(raw))] * 2
    # /v1/score answers the labels' probabilities, as without a map
    body = json.loads(_post(ingress, "/v1/score", SCORE_BODY).body)
    assert body["scores"] == [[math.exp(lp) for lp in LOGPROBS]] * 2


def test_a_calibration_file_is_checked_at_start(tmp_path):
    with pytest.raises(ValueError, match="calibration: .* has maps for \\['other'\\]"):
        _calibrated_ingress(tmp_path, {"other": {"method": "platt", "a": 1.0, "b": 0.0}})
    with pytest.raises(ValueError, match="calibration: .* is not a calibration file"):
        AppConfig(calibration=str(tmp_path / "missing.json")).calibrations()


class _AnyKeyMetrics(_Metrics):
    def answered(self, route, status, seconds, error_type=None, key="none", model="-",
                 items=0, tokens=0) -> None:
        self.answered_as.append((route, status, error_type, key, items))


def _ingress_with_keys(monkeypatch, entries: str):
    """The ingress class with API keys on, given as `auth.api_keys_env` entries."""
    monkeypatch.setenv("PIPELINE_KEYS", entries)
    user_class = ScoreIngress.func_or_class.__bases__[0]
    instance = user_class.__new__(user_class)
    try:
        user_class.__init__(instance, _Scorer(), AppConfig(auth={"api_keys_env": "PIPELINE_KEYS"}))
    finally:
        require_keys(None, lambda path: None)  # the middleware of this process: auth off again
    return instance


def test_a_bulk_keys_jobs_are_bulk_and_an_online_keys_are_not(monkeypatch):
    # serve_app/auth.py parses the class; here the ingress must carry it into each ScoreJob.
    instance = _ingress_with_keys(monkeypatch, f"etl:{'e' * 16} priority=bulk, web:{'w' * 16}")
    body = {"query": [1, 2], "items": [[3]], "label_token_ids": [7, 8]}
    for key_id, bulk in (("etl", True), ("web", False)):
        request = _Request(body)
        request.scope[KEY_ID_SCOPE] = key_id
        instance.worker, instance.metrics = _Scorer(), _AnyKeyMetrics()
        response = asyncio.run(instance._observed("/v1/score", request))
        assert response.status_code == 200
        assert [job.bulk for job in instance.worker.jobs] == [bulk]
        assert instance.metrics.answered_as == [("/v1/score", 200, None, key_id, 1)]


class _RefusingScorer(_Scorer):
    """Refuses every job as a full scorer does (a value, not an exception: ScorerOverloaded)."""

    async def remote(self, job):
        return ScorerOverloaded("the token queue is full", retry_after_s=1)


def test_a_request_of_a_key_with_a_quota_that_no_scorer_answers_is_given_back(monkeypatch):
    # Admitted by the quota, then refused (503) or past its deadline (408): not the key's to
    # pay; answered (200): counted.
    instance = _ingress_with_keys(monkeypatch, f"team:{'t' * 16} tpm=1000")
    ledger = FakeLedger()
    instance.quotas = Quotas(ledger)
    quota = Quota(tokens_per_minute=1000)

    async def post(scorer, headers=None):
        request = _Request(SCORE_BODY, headers)
        request.scope[KEY_ID_SCOPE] = "team"
        instance.worker, instance.metrics = scorer, _AnyKeyMetrics()
        # not shed after the refusal (serve_app/shedding.py draws at random): each is admitted
        instance.shedding = {False: Shedding(), True: Shedding()}
        try:
            return (await instance._observed("/v1/score", request)).status_code
        except ApiError as error:
            return error.status
        finally:
            for _ in range(500):  # a refund is sent without waiting for it: let it arrive
                await asyncio.sleep(0.01)
                if ledger.handled == ledger.calls:
                    break

    def remaining() -> int:
        return ledger.windows.usage("team", quota)["tokens_per_minute"]["remaining"]

    assert asyncio.run(post(_RefusingScorer())) == 503
    assert remaining() == 1000 and ledger.calls == 2  # charged, then given back
    assert asyncio.run(post(_SlowScorer(60), {"x-request-timeout-seconds": "0.2"})) == 408
    assert remaining() == 1000 and ledger.calls == 4
    assert asyncio.run(post(_Scorer())) == 200
    charged = 1000 - remaining()
    assert charged > 0 and ledger.calls == 5  # its usage's tokens, not given back
