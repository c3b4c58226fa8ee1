"""The job's two stages, each a Ray Data actor class (ranker_batch/job.py builds the pipeline):

- `Prepare` (CPU actors): each row → the API request it stands for, validated, tokenized and
  packed by the service's own request path (serve_app/requests.py), pickled into `_request`;
  or the API's 4xx message in `error`.
- `Score` (one actor per GPU): the prepared rows through the scorer's engine and scheduling loop
  (gpu_worker/serving/replica.py), all of a batch's rows in flight at once, so the loop packs them
  into full batches; then the API's answer of each row as output columns.

Both are 1:1 and deterministic in their row count, which is what lets Ray Data retry a block on
a restarted actor without losing or repeating rows.
"""

from __future__ import annotations

import asyncio
import pickle

import pyarrow as pa

from ranker_batch.rows import RAW_RELEVANCE, answer_columns, output_schema, request_body
from ranker_contract.config import AppConfig
from serve_app.protocol import ApiError
from serve_app.routes import RERANK_V1, SCORE
from serve_app.validate import read_body


def _route(kind: str) -> str:
    """The service's route a row of `kind` stands for. A row naming one of `models` is
    refused (404): the job scores model_path's model and its adapters."""
    return SCORE if kind == "score" else RERANK_V1


class Prepare:
    def __init__(self, config: dict, kind: str, id_column: str) -> None:
        from serve_app.requests import RequestPath

        self.path = RequestPath(AppConfig.model_validate(config))
        self.kind, self.id_column = kind, id_column

    def __call__(self, batch: pa.Table) -> pa.Table:
        route = _route(self.kind)
        prepared, errors = [], []
        for row in batch.to_pylist():
            try:
                body = read_body(request_body(self.kind, row), self.path.limits)
                own, req, adapter = self.path.parse(route, body)
                tokens = own.tokenize_now(req)
                packed = self.path.pack(own, tokens, adapter)
            except ApiError as exc:
                prepared.append(None)
                errors.append(f"{exc.status} {exc.message}")
                continue
            prepared.append(pickle.dumps((req, tokens, packed)))
            errors.append(None)
        return pa.table({self.id_column: batch.column(self.id_column),
                         "_request": pa.array(prepared, pa.binary()),
                         "error": pa.array(errors, pa.string())})


class Score:
    def __init__(self, config: dict, kind: str, id_column: str) -> None:
        from gpu_worker.serving.replica import start_scorer
        from serve_app.requests import RequestPath

        app = AppConfig.model_validate(config)
        # Offline: every row waits its turn; nothing is refused for queueing.
        offline = app.scheduler.model_copy(update={"max_queue_wait_s": 0})
        self.scorer = start_scorer(app, offline)
        self.path = RequestPath(app)
        self.kind, self.id_column = kind, id_column
        self.calibrated = app.calibration is not None

    async def __call__(self, batch: pa.Table) -> pa.Table:
        requests, errors = batch.column("_request").to_pylist(), batch.column("error").to_pylist()
        answers = await asyncio.gather(*(self._answer(r) for r in requests))
        scores = [a[0] if a else None for a in answers]
        tokens = [a[1] if a else None for a in answers]
        schema = output_schema(self.kind, batch.schema.field(self.id_column), self.calibrated)
        columns = [batch.column(self.id_column), pa.array(scores, schema.field(1).type)]
        if RAW_RELEVANCE.name in schema.names:
            columns.append(pa.array([a[2] if a else None for a in answers], RAW_RELEVANCE.type))
        columns += [pa.array(tokens, pa.int64()), pa.array(errors, pa.string())]
        return pa.table(columns, schema=schema)

    async def _answer(self, request: bytes | None) -> tuple[list, int, list | None] | None:
        if request is None:  # refused by Prepare: its error says why
            return None
        req, tokens, packed = pickle.loads(request)
        results = (await self.scorer.scheduler.run_job(packed.job(tokens))).results \
            if packed.sequences else []
        route = self.path.route_for(_route(self.kind), packed.adapter)
        return answer_columns(self.kind, self.path.respond(route, req, tokens, packed, results))

    def __del__(self) -> None:
        if getattr(self, "scorer", None) is not None:
            self.scorer.scheduler.stop()
