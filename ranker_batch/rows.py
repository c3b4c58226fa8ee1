"""A dataset row as the API request it stands for, and the API's answer as output columns.

A `score` row holds the fields of a /v1/score body (`query`, `items`, and optionally
`label_token_ids`, `apply_softmax`, `item_first`, `model`); a `rerank` row those of a /v1/rerank
body (`query`, `documents`, optionally `instruction`, `max_tokens_per_doc`,
`max_chunks_per_doc`, `truncate`, `truncation_direction`, `model`: a long document scores as
its best chunk, as on the API; `model` may name a LoRA adapter).
Missing or null optional fields take the API's defaults. Every row passes through the service's
own validation (serve_app/requests.py), so a bad row gets the API's 4xx message in its `error`
column instead of scores.
"""

from __future__ import annotations

import json

import pyarrow as pa

KINDS = ("score", "rerank")
REQUEST_FIELDS = {
    "score": ("query", "items", "label_token_ids", "apply_softmax", "item_first", "model"),
    "rerank": ("query", "documents", "instruction", "max_tokens_per_doc", "max_chunks_per_doc",
               "truncate", "truncation_direction", "model"),
}
OUTPUT_SCHEMA = {
    # per item, one probability per label (the API's `scores`)
    "score": pa.field("scores", pa.list_(pa.list_(pa.float64()))),
    # per document, in the input's order (the API's `relevance_score` of each `index`)
    "rerank": pa.field("relevance_scores", pa.list_(pa.float64())),
}


def request_body(kind: str, row: dict) -> bytes:
    """The JSON body the row stands for: its request fields that are present and not null."""
    body = {name: row[name] for name in REQUEST_FIELDS[kind] if row.get(name) is not None}
    return json.dumps(body).encode()


# a rerank job with a calibration map: the model's relevance beside the calibrated one
RAW_RELEVANCE = pa.field("raw_relevance_scores", pa.list_(pa.float64()))


def answer_columns(kind: str, response: dict) -> tuple[list, int, list | None]:
    """(the kind's scores column value, prompt tokens, the raw relevance per document where
    the answer is calibrated, else None) of an API response body."""
    tokens = response["usage"]["total_tokens"]  # both routes: every token is a prompt token
    if kind == "score":
        return response["scores"], tokens, None
    relevance = [0.0] * len(response["results"])
    raw = [0.0] * len(response["results"])
    for result in response["results"]:
        relevance[result["index"]] = result["relevance_score"]
        raw[result["index"]] = result.get("raw_score")
    return relevance, tokens, raw if None not in raw else None


def output_schema(kind: str, id_field: pa.Field, calibrated: bool = False) -> pa.Schema:
    """`calibrated`: a rerank job whose config has a calibration map adds RAW_RELEVANCE."""
    raw = [RAW_RELEVANCE] if calibrated and kind == "rerank" else []
    return pa.schema([id_field, OUTPUT_SCHEMA[kind], *raw, pa.field("prompt_tokens", pa.int64()),
                      pa.field("error", pa.string())])
