"""The ingress deployment: HTTP routes, the pipeline they share, routing to scorer replicas."""

# NOTE: no `from __future__ import annotations`: FastAPI must see real types on the routes.

import asyncio
import logging
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ranker_contract.config import AppConfig
from ranker_contract.errors import ScorerOverloaded
from ranker_contract.packing import ScoredJob, ScoreJob
from serve_app.auth import KEY_ID_SCOPE, NO_KEY, REFUSED_KEY, KeyStore, RequireApiKey, require_keys
from serve_app.deadline import TIMEOUT_HEADER, answer_by_s, request_timeout_s, serve_timeout_s
from serve_app.docs_page import add_offline_docs
from serve_app.metrics import (
    CANCELLED_STATUS,
    CANCELLED_TYPE,
    NO_MODEL,
    IngressMetrics,
)
from serve_app.protocol import (
    RERANK_EXAMPLE,
    ApiError,
    ErrorResponse,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)
from serve_app.quotas import NO_QUOTA, Quotas
from serve_app.requests import ServedModels
from serve_app.routes import RERANK_V1, RERANK_V2, ROUTES, SCORE
from serve_app.shedding import Shedding

logger = logging.getLogger(__name__)

app = FastAPI(
    title="LLM ranking service",
    description="Scores items against a query with a causal LM (label-token probabilities) or "
    "a sequence-classification model (class logits).",
    docs_url=None, redoc_url=None,  # served with local assets instead of a CDN's
)
add_offline_docs(app)
# Outside every route, so /docs, /openapi.json and unknown routes need a key too; a no-op
# until an ingress replica turns API keys on (docs/ARCHITECTURE.md, "API keys").
app.add_middleware(RequireApiKey)

_SCORE_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ScoreRequest.model_json_schema()}},
    }
}

_RERANK_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": RerankRequest.model_json_schema(),
                                         "example": RERANK_EXAMPLE}},
    }
}
_ERROR_RESPONSES = {code: {"model": ErrorResponse} for code in (400, 404, 413, 503)}

HEALTH_TIMEOUT_S = 5.0
# A job whose replica died is sent again, after a pause that doubles each time: until Ray has
# declared the killed actor dead, a send can reach it again and fail as "unavailable".
REPLICA_LOST_RETRIES = 3
REPLICA_LOST_BACKOFF_S = 0.25
# A job not answered within this time makes the ingress ask Serve whether any scorer replica
# is RUNNING (at most once per interval per ingress replica). With none (its node lost, the
# replacement pending) Serve would hold the job until one appears: a hang until the request
# timeout, where the client should get a 503 at once.
SCORER_CHECK_S = 1.0


DEFAULT_OPTIONS = {
    "max_ongoing_requests": 256,
    "ray_actor_options": {"num_cpus": 0.5},
}


@app.exception_handler(ApiError)
async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.envelope(), status_code=exc.status, headers=exc.headers)


@app.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    # Unknown routes and wrong methods get the same envelope as every other error.
    return await _api_error(_, ApiError(exc.status_code, str(exc.detail)))


def _at_capacity(retry_after_s: float | None, reason: str = "") -> ApiError:
    return ApiError(503, "the scorer replicas are at capacity; retry later"
                    + (f" ({reason})" if reason else ""),
                    headers={"Retry-After": str(max(1, round(retry_after_s or 1)))})


def _timed_out(timeout_s: float) -> ApiError:
    return ApiError(408, f"the request was not answered within its deadline of "
                    f"{timeout_s:g} s and was dropped unscored; ask for a longer one with the "
                    f"header {TIMEOUT_HEADER}: N (0: none)")


def _no_scorer(reason: str) -> ApiError:
    return ApiError(503, f"no scorer replica is available ({reason}); retry later",
                    headers={"Retry-After": "1"})


class ScorerWatch:
    """Whether Serve's controller counts any scorer replica RUNNING; asked only for a job not
    answered within SCORER_CHECK_S, and at most once per SCORER_CHECK_S for all of this
    replica's requests. Never on the way of a request that is answered in time: the call to
    the controller costs an idle request milliseconds (docs/ARCHITECTURE.md, "Load control")."""

    def __init__(self, worker: DeploymentHandle) -> None:
        self.app, self.deployment = worker.app_name, worker.deployment_name
        self._running: int | None = None  # None: not known (never refuse on a guess)
        self._lock = asyncio.Lock()
        self._asked = float("-inf")

    async def any_running(self) -> bool:
        async with self._lock:
            if time.monotonic() - self._asked >= SCORER_CHECK_S:
                self._running = await asyncio.to_thread(self._ask)
                self._asked = time.monotonic()
        return self._running is None or self._running > 0

    def _ask(self) -> int | None:
        try:  # serve.status() is a blocking call to the controller: run in a thread
            deployments = serve.status().applications[self.app].deployments
            return deployments[self.deployment].replica_states.get("RUNNING", 0)
        except Exception:  # noqa: BLE001 - not known
            logger.warning("could not read the replica states", exc_info=True)
            return None


async def _answer(response: DeploymentResponse, scorers: ScorerWatch):
    """The scorer's answer; 503 once Serve has no RUNNING scorer replica while it waits."""
    waiting = asyncio.ensure_future(response)
    try:
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=SCORER_CHECK_S)
            if done:
                return waiting.result()
            if not await scorers.any_running():
                raise _no_scorer("none is running")
    finally:
        if not waiting.done():  # refused, or our own request was cancelled
            response.cancel()
            waiting.cancel()
            # Serve then fails it with RequestCancelledError: expected, so read and dropped
            # here rather than logged as "Task exception was never retrieved".
            waiting.add_done_callback(_drop_outcome)


def _drop_outcome(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _server_timing(started: float, parsed: float, tokenized: float, packed: float,
                   admitted: float, scored: float, job: ScoredJob) -> dict[str, str]:
    # Server-Timing (a standard header) lets clients and load tests see where time went.
    # quota is the ledger's answer (0 for a key without a quota); worker = hop + queue +
    # compute: hop is the handle call both ways (routing, serialization, the replica's event
    # loop), queue the wait for the first batch, compute the rest.
    worker = scored - admitted
    timing = {"parse": parsed - started, "tokenize": tokenized - parsed,
              "pack": packed - tokenized, "quota": admitted - packed, "worker": worker,
              "hop": max(0.0, worker - job.queued_s - job.computed_s),
              "queue": job.queued_s, "compute": job.computed_s,
              "ingress": time.perf_counter() - started}
    return {"Server-Timing": ", ".join(f"{name};dur={s * 1e3:.2f}" for name, s in timing.items())}


@dataclass(slots=True)
class _Seen:
    """A request's `model` label (NO_MODEL until its model is known), items and tokens
    scored."""

    model: str = NO_MODEL
    items: int = 0
    tokens: int = 0


# NOTE: helpers the class uses are defined above it: serve.ingress pickles a copy of the app
# and its route functions when it decorates the class, so their globals must exist by then.
@serve.deployment(**DEFAULT_OPTIONS)
@serve.ingress(app)
class ScoreIngress:
    def __init__(self, worker: DeploymentHandle, config: AppConfig,
                 quota_ledger: DeploymentHandle | None = None) -> None:
        self.worker = worker
        self.models = ServedModels(config)
        self.model_name = config.served_model_name
        self.cache_owner = config.auth.cache_owner  # by the caller's key id
        keys = KeyStore(config.auth) if config.auth.enabled else None  # bad keys: start fails
        self.keys = keys
        self.quotas = Quotas(quota_ledger)  # per key: serve_app/quotas.py
        self.metrics = IngressMetrics((*keys.ids, REFUSED_KEY) if keys else (NO_KEY,),
                                      self.models.names)
        if keys is not None:
            keys.on_reload = self.metrics.declare_keys
        require_keys(keys, self._refused)
        self.scorers = ScorerWatch(worker)
        # One per priority class, each following the scorers' answers to its own jobs: past
        # capacity the scorers refuse bulk work, so bulk requests are shed and online ones not.
        self.shedding = {False: Shedding(), True: Shedding()}  # by ScoreJob.bulk
        self.timeout_s = serve_timeout_s()

    @app.post(SCORE, response_model=ScoreResponse, openapi_extra=_SCORE_OPENAPI,
              responses=_ERROR_RESPONSES)
    async def score(self, request: Request) -> JSONResponse:
        return await self._observed(SCORE, request)

    @app.post(RERANK_V1, response_model=RerankResponse, openapi_extra=_RERANK_OPENAPI,
              responses=_ERROR_RESPONSES, summary="Rerank (Cohere v1 / Jina shape)")
    async def rerank_v1(self, request: Request) -> JSONResponse:
        return await self._observed(RERANK_V1, request)

    @app.post(RERANK_V2, response_model=RerankResponse, openapi_extra=_RERANK_OPENAPI,
              responses=_ERROR_RESPONSES, summary="Rerank (Cohere v2 shape)")
    async def rerank_v2(self, request: Request) -> JSONResponse:
        return await self._observed(RERANK_V2, request)

    async def _observed(self, path: str, request: Request) -> JSONResponse:
        """Request, error and latency metrics around the pipeline of route `path`."""
        started = time.perf_counter()
        status, error_type = 500, "InternalServerError"
        seen = _Seen()
        try:
            bulk = self.keys is not None and self.keys.bulk(request.scope.get(KEY_ID_SCOPE))
            if self.shedding[bulk].shed():  # far past capacity: not even read (shedding.py)
                raise _at_capacity(1, "shedding")
            timeout_s = request_timeout_s(request.headers.get(TIMEOUT_HEADER), self.timeout_s)
            deadline = asyncio.timeout(None if timeout_s is None else answer_by_s(timeout_s))
            try:
                async with deadline:
                    response = await self._pipeline(path, request, started, seen)
            except TimeoutError:
                if not deadline.expired():
                    raise
                raise _timed_out(timeout_s) from None
            status, error_type = response.status_code, None
            return response
        except ApiError as exc:
            # a deadline that passed counts as cancelled, like a client that left (metrics)
            status = exc.status
            error_type = CANCELLED_TYPE if exc.status == CANCELLED_STATUS else exc.kind
            raise
        except asyncio.CancelledError:  # the client went away or its timeout passed
            status, error_type = CANCELLED_STATUS, CANCELLED_TYPE
            raise
        finally:
            self.metrics.answered(path, status, time.perf_counter() - started, error_type,
                                  key=request.scope.get(KEY_ID_SCOPE, NO_KEY), model=seen.model,
                                  items=seen.items, tokens=seen.tokens)

    def _refused(self, path: str) -> None:
        # Counted for the scoring routes only: an unknown path must not become a label value.
        if path in ROUTES:
            self.metrics.answered(path, 401, 0.0, ApiError(401, "").kind, key=REFUSED_KEY)

    async def _pipeline(self, path: str, request: Request, started: float,
                        seen: _Seen) -> JSONResponse:
        """parse → tokenize → pack → await a scorer → merge → respond, each step timed; the
        routes differ only in their own steps (serve_app/routes.py), the models in their
        request paths (serve_app/requests.py). `seen`: what the metrics label the request with,
        filled in as it becomes known."""
        key_id = request.scope.get(KEY_ID_SCOPE, NO_KEY)
        quota = NO_QUOTA if self.keys is None else self.keys.quota(key_id)
        self.quotas.refuse_early(key_id)  # not read while its key is known to be over quota
        parsed_request = self.models.parse(path, await request.body())
        model_path, route, req = parsed_request.path, parsed_request.route, parsed_request.request
        seen.model = parsed_request.model
        parsed = time.perf_counter()
        tokens = await route.tokenize(req)
        tokenized = time.perf_counter()
        packed_job = model_path.pack(route, tokens, parsed_request.adapter,
                                     self.cache_owner(request.scope.get(KEY_ID_SCOPE)))
        packed = time.perf_counter()
        charge = await self.quotas.take(key_id, quota, packed_job.tokens)  # usage.prompt_tokens
        admitted = time.perf_counter()
        bulk = self.keys is not None and self.keys.bulk(key_id)
        try:
            job = await self._call_worker(packed_job.job(tokens, bulk))
        except BaseException:  # not scored (503, 408, the client gone): not the key's to pay
            self.quotas.refund(charge)
            raise
        scored = time.perf_counter()
        body = model_path.respond(route, req, tokens, packed_job, job.results)
        seen.items, seen.tokens = len(tokens.items), packed_job.tokens
        if tokens.from_text:
            self.metrics.tokenize_ms.observe((tokenized - parsed) * 1e3)
        return JSONResponse(body, headers=_server_timing(started, parsed, tokenized, packed,
                                                         admitted, scored, job))

    @app.get("/v1/models")
    async def models(self) -> dict:
        return {"object": "list",
                "data": [{"id": name, "object": "model", "owned_by": "ranker"}
                         for name in self.models.names]}

    @app.get("/v1/usage")
    async def usage(self, request: Request) -> dict:
        """The calling key's quota: each limit, what is left of it now and when all of it is
        back (null where the key has no such limit; docs/OPERATIONS.md, "Quotas")."""
        key_id = request.scope.get(KEY_ID_SCOPE, NO_KEY)
        quota = NO_QUOTA if self.keys is None else self.keys.quota(key_id)
        return {"object": "usage", "key": key_id, **await self.quotas.usage(key_id, quota)}

    @app.get("/health")
    async def health(self) -> dict:
        # Healthy means a scorer replica answers, not only that this process is up.
        try:
            await asyncio.wait_for(self.worker.ping.remote(), timeout=HEALTH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - any failure means not ready
            raise ApiError(503, f"no scorer replica is ready: {type(exc).__name__}") from None
        return {"status": "ok", "model": self.model_name}

    async def _call_worker(self, job: ScoreJob) -> ScoredJob:
        # Failures of the scorer reach the client in the same envelope as every other error.
        if not job.sequences:  # no items: nothing to score
            return ScoredJob([], queued_s=0.0, computed_s=0.0)
        for attempt in range(1 + REPLICA_LOST_RETRIES):
            try:
                result = await _answer(self.worker.score.remote(job), self.scorers)
            except BackPressureError as exc:  # Serve's queue in front of the scorers is full
                self.shedding[job.bulk].answered(refused=True)
                raise _at_capacity(exc.retry_after_s) from None
            except DeploymentUnavailableError:  # the scorer deployment failed to deploy
                raise _no_scorer("the scorer deployment failed") from None
            except ApiError:  # no scorer running (_answer)
                raise
            except RayActorError as exc:
                # The replica died or became unreachable with our job. Scoring is idempotent,
                # so the job is sent again; the router picks a live replica.
                if attempt == REPLICA_LOST_RETRIES:
                    raise ApiError(503, f"the scorer replica was lost: {type(exc).__name__}; "
                                   "retry later", headers={"Retry-After": "1"}) from None
                logger.warning("scorer replica lost (%s); sending the job again",
                               type(exc).__name__)
                self.metrics.retries.inc()
                await asyncio.sleep(REPLICA_LOST_BACKOFF_S * 2**attempt)
                continue
            except Exception as exc:  # noqa: BLE001 - anything else is the server's fault
                logger.exception("scoring failed")
                raise ApiError(500, f"scoring failed: {type(exc).__name__}") from None
            overloaded = isinstance(result, ScorerOverloaded)
            self.shedding[job.bulk].answered(refused=overloaded)
            if overloaded:  # the scorer's answer, not a failure
                logger.info("refused: %s", result)
                raise _at_capacity(result.retry_after_s, str(result))
            return result
        raise AssertionError("unreachable")

