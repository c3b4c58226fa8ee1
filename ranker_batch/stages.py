"""The job's two stages, each a Ray Data actor class (ranker_batch/job.py builds the pipeline):

- `Prepare` (CPU actors): each row → the API request it stands for, validated and tokenized by
  the service's own request path (serve_app/requests.py); or the API's 4xx message in `error`.
- `Score` (one actor per GPU): the prepared rows packed and through the scorer's engine and
  scheduling loop (gpu_worker/replica.py), all of a batch's rows in flight at once, so the loop
  packs them into full batches; then the API's answer of each row as output columns.

Between them a row is plain Arrow columns (PREPARED): the request body and its tokens, field by
field, readable by any tool and by another version of this code; Score reads the body again
(tens of µs a row, against the tokenizing it is spared) and packs the tokens.

Both are 1:1 and deterministic in their row count, which is what lets Ray Data retry a block on
a restarted actor without losing or repeating rows.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pyarrow as pa

from ranker_batch.rows import RAW_RELEVANCE, answer_columns, output_schema, request_body
from ranker_contract.config import AppConfig
from serve_app.protocol import ApiError
from serve_app.routes import RERANK_V1, SCORE, Tokenized
from serve_app.validate import read_body

# A prepared row's columns besides the id and `error`: the request body, then each field of
# its tokens (serve_app/routes.py::Tokenized) under its name after "_".
BODY = pa.field("_body", pa.binary())
TOKENS = [pa.field(f"_{name}", kind) for name, kind in {
    "prefix": pa.list_(pa.int32()),
    "items": pa.list_(pa.list_(pa.int32())),
    "label_ids": pa.list_(pa.int64()),
    "from_text": pa.bool_(),
    "item_first": pa.bool_(),
    "truncated": pa.int64(),
    "documents": pa.list_(pa.int64()),
    "capped": pa.int64(),
    "spans": pa.list_(pa.list_(pa.int64())),  # (start, end) pairs
}.items()]
PREPARED = pa.schema([BODY, *TOKENS])


def tokens_of(row: dict) -> Tokenized:
    """The Tokenized a prepared row's columns hold."""
    fields = {f.name: row[f"_{f.name}"] for f in dataclasses.fields(Tokenized)}
    if fields["spans"] is not None:
        fields["spans"] = [tuple(span) for span in fields["spans"]]
    return Tokenized(**fields)


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
        bodies: list[bytes | None] = []
        tokens: list[Tokenized | None] = []
        errors: list[str | None] = []
        for row in batch.to_pylist():
            body = request_body(self.kind, row)
            try:
                own, req, _ = self.path.parse(route, read_body(body, self.path.limits))
                tokens.append(own.tokenize_now(req))
                bodies.append(body)
                errors.append(None)
            except ApiError as exc:
                tokens.append(None)
                bodies.append(None)
                errors.append(f"{exc.status} {exc.message}")
        columns = [pa.array(bodies, BODY.type)]
        columns += [pa.array([getattr(t, field.name[1:]) if t else None for t in tokens],
                             field.type) for field in TOKENS]
        return pa.table([batch.column(self.id_column), *columns, pa.array(errors, pa.string())],
                        names=[self.id_column, *PREPARED.names, "error"])


class Score:
    def __init__(self, config: dict, kind: str, id_column: str) -> None:
        from gpu_worker.replica import start_scorer
        from serve_app.requests import RequestPath

        app = AppConfig.model_validate(config)
        # Offline: every row waits its turn; nothing is refused for queueing.
        offline = app.scheduler.model_copy(update={"max_queue_wait_s": 0})
        self.scorer = start_scorer(app, offline)
        self.path = RequestPath(app)
        self.kind, self.id_column = kind, id_column
        self.calibrated = app.calibration is not None

    async def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        answers = await asyncio.gather(*(self._answer(r) for r in rows))
        scores = [a[0] if a else None for a in answers]
        tokens = [a[1] if a else None for a in answers]
        errors = batch.column("error")
        schema = output_schema(self.kind, batch.schema.field(self.id_column), self.calibrated)
        columns = [batch.column(self.id_column), pa.array(scores, schema.field(1).type)]
        if RAW_RELEVANCE.name in schema.names:
            columns.append(pa.array([a[2] if a else None for a in answers], RAW_RELEVANCE.type))
        columns += [pa.array(tokens, pa.int64()), errors]
        return pa.table(columns, schema=schema)

    async def _answer(self, row: dict) -> tuple[list, int, list | None] | None:
        if row[BODY.name] is None:  # refused by Prepare: its error says why
            return None
        route, req, adapter = self.path.parse(_route(self.kind),
                                              read_body(row[BODY.name], self.path.limits))
        tokens = tokens_of(row)
        packed = self.path.pack(route, tokens, adapter)
        results = (await self.scorer.scheduler.run_job(packed.job(tokens))).results \
            if packed.sequences else []
        return answer_columns(self.kind, self.path.respond(route, req, tokens, packed, results))

    def __del__(self) -> None:
        if getattr(self, "scorer", None) is not None:
            self.scorer.scheduler.stop()
