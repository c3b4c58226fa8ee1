"""Scorer failures reach the client as enveloped 5xx; a lost replica's job is sent again (3
times)."""

import asyncio
import gc
import pickle
from types import SimpleNamespace

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError
from ray.serve._private.common import DeploymentID
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

import serve_app.ingress
from ranker_contract.errors import ScorerOverloaded
from ranker_contract.packing import ScoredJob, ScoreJob, pack_plain
from serve_app.ingress import ScoreIngress
from serve_app.protocol import ApiError
from serve_app.shedding import Shedding

RESULT = ScoredJob([[[-0.5, -1.5]]], queued_s=0.001, computed_s=0.002)


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


class _Scorers:
    """Stands in for ScorerWatch: what Serve's controller would say about scorer replicas."""

    def __init__(self, running: bool = True) -> None:
        self.running = running
        self.asked = 0

    async def any_running(self) -> bool:
        self.asked += 1
        return self.running


class _Pending:
    """A DeploymentResponse that answers RESULT after `after_s` (never, if None)."""

    def __init__(self, after_s: float | None) -> None:
        self.after_s = after_s
        self.cancelled = False

    def __await__(self):
        return self._wait().__await__()

    async def _wait(self):
        if self.after_s is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.after_s)
        return RESULT

    def cancel(self) -> None:
        self.cancelled = True


class _PendingHandle:
    def __init__(self, after_s: float | None) -> None:
        self.score = self
        self.response = _Pending(after_s)

    def remote(self, job):
        return self.response


def _ingress(handle, scorers: _Scorers | None = None) -> SimpleNamespace:
    # The method only needs these attributes; the Serve-wrapped class is not built outside Serve.
    return SimpleNamespace(worker=handle, metrics=SimpleNamespace(retries=_Count()),
                           scorers=scorers or _Scorers(),
                           shedding={False: Shedding(), True: Shedding()})


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


def test_a_scorer_refusal_is_503_with_retry_after():
    err = _error(ScorerOverloaded("9000 tokens ahead, more than 0.5 s of work"))
    assert err.status == 503 and err.headers == {"Retry-After": "1"}
    assert err.message == ("the scorer replicas are at capacity; retry later (9000 tokens "
                           "ahead, more than 0.5 s of work)")


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


def test_no_running_scorer_is_a_503_not_a_wait_for_one(monkeypatch):
    # The scorer's node is gone and Serve would hold the job until a replica appears.
    monkeypatch.setattr(serve_app.ingress, "SCORER_CHECK_S", 0.05)
    handle = _PendingHandle(after_s=None)
    with pytest.raises(ApiError) as caught:
        _call(_ingress(handle, _Scorers(running=False)))
    assert caught.value.status == 503 and caught.value.headers == {"Retry-After": "1"}
    assert caught.value.envelope()["error"]["message"] == (
        "no scorer replica is available (none is running); retry later")
    assert handle.response.cancelled  # not left waiting in Serve's queue


def test_slow_answer_while_a_scorer_runs_is_waited_for(monkeypatch):
    monkeypatch.setattr(serve_app.ingress, "SCORER_CHECK_S", 0.05)
    handle, scorers = _PendingHandle(after_s=0.5), _Scorers(running=True)
    assert _call(_ingress(handle, scorers)) == RESULT
    assert scorers.asked >= 2 and not handle.response.cancelled


def test_failed_scorer_deployment_is_a_503():
    err = _error(DeploymentUnavailableError(DeploymentID(name="ScoreWorker", app_name="score")))
    assert err.status == 503 and err.headers == {"Retry-After": "1"}
    assert "the scorer deployment failed" in err.message


def test_a_request_cancelled_while_it_waits_leaves_no_unretrieved_exception():
    """A client that gives up cancels its request; Serve then fails the scorer call with
    RequestCancelledError. That is normal traffic: nothing may be logged as "Task exception was
    never retrieved" for it."""
    from ray.serve.exceptions import RequestCancelledError

    class _FailsWhenCancelled(_Pending):
        async def _wait(self):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise RequestCancelledError("the caller went away") from None

    reported = []

    async def go():
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        handle = _PendingHandle(after_s=None)
        handle.response = _FailsWhenCancelled(None)
        call = asyncio.ensure_future(ScoreIngress.func_or_class._call_worker(
            _ingress(handle), ScoreJob([pack_plain([1, 2], 0)], [5])))
        await asyncio.sleep(0.05)
        call.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(0.05)
        gc.collect()  # an unretrieved exception is reported when its task is collected
        await asyncio.sleep(0)

    asyncio.run(go())
    assert not reported, reported
