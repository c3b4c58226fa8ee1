"""A failing scorer reaches the client as an enveloped 5xx, not Serve's bare 500."""

import asyncio
from types import SimpleNamespace

import pytest
from ray.serve.exceptions import BackPressureError

from serve_app.ingress import ScoreIngress
from serve_app.packing import ScoreJob, pack_plain
from serve_app.protocol import ApiError


class _FailingHandle:
    """Stands in for the scorer's DeploymentHandle: `.score.remote(job)` raises `error`."""

    def __init__(self, error: Exception) -> None:
        self.score = self
        self.error = error

    async def remote(self, job):
        raise self.error


def _call(error: Exception) -> ApiError:
    # The method only needs `self.worker`; the Serve-wrapped class is not built outside Serve.
    ingress = SimpleNamespace(worker=_FailingHandle(error))
    call_worker = ScoreIngress.func_or_class._call_worker
    with pytest.raises(ApiError) as caught:
        asyncio.run(call_worker(ingress, ScoreJob([pack_plain([1, 2], 0)], [5])))
    return caught.value


def test_scorer_exception_is_an_enveloped_500():
    err = _call(RuntimeError("poisoned batch"))
    assert err.status == 500
    assert err.envelope()["error"] == {"message": "scoring failed: RuntimeError",
                                       "type": "InternalServerError", "param": None, "code": 500}


def test_scorer_backpressure_is_503_with_retry_after():
    err = _call(BackPressureError(num_queued_requests=10, max_queued_requests=10,
                                  retry_after_s=2.0))
    assert err.status == 503 and err.headers == {"Retry-After": "2"}
