"""Scorer failures reach the client as enveloped 5xx; a lost replica's job is sent again (3 times)."""

import asyncio
import pickle
from types import SimpleNamespace

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError
from ray.serve.exceptions import BackPressureError

from ranker_contract.errors import ScorerOverloaded
from serve_app.ingress import ScoreIngress
from ranker_contract.packing import ScoreJob, pack_plain
from serve_app.protocol import ApiError

RESULT = [[[-0.5, -1.5]]]


class _ScriptedHandle:
    """Stands in for the scorer's DeploymentHandle: `.score.remote(job)` raises the scripted
    errors in turn (a ScorerOverloaded is returned, as the replica does), then returns RESULT."""

    def __init__(self, *errors: Exception) -> None:
        self.score = self
        self.errors = list(errors)
        self.calls = 0

    async def remote(self, job):
        self.calls += 1
        if self.errors:
            error = self.errors.pop(0)
            if isinstance(error, ScorerOverloaded):
                return error
            raise error
        return RESULT


class _Count:
    def __init__(self) -> None:
        self.value = 0

    def inc(self, *_, **__) -> None:
        self.value += 1


def _ingress(handle: _ScriptedHandle) -> SimpleNamespace:
    # The method only needs these attributes; the Serve-wrapped class is not built outside Serve.
    return SimpleNamespace(worker=handle, metrics=SimpleNamespace(retries=_Count()))


def _call(ingress: SimpleNamespace):
    call_worker = ScoreIngress.func_or_class._call_worker
    return asyncio.run(call_worker(ingress, ScoreJob([pack_plain([1, 2], 0)], [5])))


def _error(*errors: Exception) -> ApiError:
    with pytest.raises(ApiError) as caught:
        _call(_ingress(_ScriptedHandle(*errors)))
    return caught.value


def test_scorer_exception_is_an_enveloped_500():
    err = _error(RuntimeError("poisoned batch"))
    assert err.status == 500
    assert err.envelope()["error"] == {"message": "scoring failed: RuntimeError",
                                       "type": "InternalServerError", "param": None, "code": 500}


def test_scorer_backpressure_is_503_with_retry_after():
    err = _error(BackPressureError(num_queued_requests=10, max_queued_requests=10,
                                   retry_after_s=2.0))
    assert err.status == 503 and err.headers == {"Retry-After": "2"}


def test_full_token_queue_is_503_with_retry_after():
    err = _error(ScorerOverloaded("9000 tokens already queued (limit 8192)"))
    assert err.status == 503 and err.headers == {"Retry-After": "1"}
    assert err.message == ("the scorer replicas are at capacity; retry later (9000 tokens "
                           "already queued (limit 8192))")


@pytest.mark.parametrize("lost", [ActorDiedError(), ActorUnavailableError("gone", b"\0" * 16)],
                         ids=["died", "unavailable"])
def test_job_of_a_lost_replica_is_sent_again(lost):
    handle = _ScriptedHandle(lost)
    ingress = _ingress(handle)
    assert _call(ingress) == RESULT
    assert handle.calls == 2 and ingress.metrics.retries.value == 1


def test_job_is_sent_again_while_killed_replica_still_looks_alive():
    # Until Ray declares a killed replica dead, the router may pick it again: three losses in
    # a row still end in scores.
    handle = _ScriptedHandle(*(ActorUnavailableError("gone", b"\0" * 16) for _ in range(3)))
    ingress = _ingress(handle)
    assert _call(ingress) == RESULT
    assert handle.calls == 4 and ingress.metrics.retries.value == 3


def test_fourth_lost_replica_is_a_503_not_a_fifth_try():
    handle = _ScriptedHandle(*(ActorDiedError() for _ in range(4)))
    with pytest.raises(ApiError) as caught:
        _call(_ingress(handle))
    assert caught.value.status == 503 and caught.value.headers == {"Retry-After": "1"}
    assert handle.calls == 4


def test_overload_error_keeps_its_fields_through_pickling():
    # Ray pickles the replica's refusal to the caller; Retry-After comes from the copy.
    copy = pickle.loads(pickle.dumps(ScorerOverloaded("9000 tokens already queued (limit 8192)",
                                                      retry_after_s=3)))
    assert str(copy) == "9000 tokens already queued (limit 8192)" and copy.retry_after_s == 3
