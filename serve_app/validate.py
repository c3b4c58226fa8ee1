"""Request checks that need the model (vocabulary) or the service limits; all raise ApiError."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ranker_contract.config import Limits
from serve_app.classifier import check_class_ids, check_normalisation
from serve_app.protocol import ApiError, ScoreRequest


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    is_text: bool
    query: str | list[int]
    items: list[str] | list[list[int]]
    label_ids: list[int]  # vocabulary ids (causal LM) or class indices (classifier)
    apply_softmax: bool
    item_first: bool
    model: str | None
    apply_sigmoid: bool = False  # classifiers only


_UNION_MESSAGES = {
    "query": "query must be a string or a list of token ids (integers)",
    "items": "items must be a string, a list of strings, or a list of token-id lists",
    "documents": 'documents must be a list of strings or of objects {"text": string}',
}


M = TypeVar("M", bound=BaseModel)


def read_body(body: bytes, limits: Limits) -> dict:
    """The body as a JSON object; every malformed input is a 4xx."""
    if len(body) > limits.max_body_bytes:
        raise ApiError(413, f"request body is larger than {limits.max_body_bytes} bytes", "body")
    try:
        data = json.loads(body, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", "body") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object", "body")
    return data


def as_schema(data: dict, schema: type[M] = ScoreRequest) -> M:
    """A body (read_body) as `schema`; a field that does not fit is a 400 naming it."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise _describe(exc) from None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    # json.loads silently keeps the last of two equal keys, other parsers the first: a body
    # with two "items" is ambiguous, so it is refused (in any object, not only the top one).
    data = dict(pairs)
    if len(data) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ApiError(400, f"duplicate key {key!r} in the request body", key)
            seen.add(key)
    return data


def _describe(exc: ValidationError) -> ApiError:
    err = exc.errors()[0]
    loc = err["loc"]
    field = str(loc[0]) if loc else None
    if field == "documents" and len(loc) > 1 and isinstance(loc[1], int):
        # One of the union's members failed; name the document, not pydantic's member tag.
        param = f"documents[{loc[1]}]"
        return ApiError(400, f'{param} must be a string or an object {{"text": string}}', param)
    if err["type"] == "extra_forbidden":
        return ApiError(400, f"unknown field {field!r}", field)
    if field in _UNION_MESSAGES:
        return ApiError(400, _UNION_MESSAGES[field], field)
    path = field or "body"
    for part in loc[1:]:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return ApiError(400, f"{path}: {err['msg']}", path)


def check_request(req: ScoreRequest, limits: Limits, vocab_size: int,
                  num_labels: int | None = None) -> ParsedRequest:
    """Everything that can be checked before tokenization. `num_labels`: the model is a
    classifier of that many classes (serve_app/classifier.py), None: a causal LM."""
    if num_labels is not None:
        labels = check_class_ids(req.label_token_ids, num_labels, limits.max_labels_per_request)
        check_normalisation(req.apply_softmax, bool(req.apply_sigmoid), num_labels)
    else:
        labels = _check_vocabulary_labels(req, limits, vocab_size)

    if req.items is None:
        raise ApiError(400, "items must be provided", "items")
    items = [req.items] if isinstance(req.items, str) else req.items
    if len(items) > limits.max_items_per_request:
        raise ApiError(413, f"{len(items)} items; the limit is {limits.max_items_per_request} "
                       "per request", "items")
    items_are_text = bool(items) and isinstance(items[0], str)
    query = req.query
    if query is None:
        query = "" if items_are_text or not items else []
    is_text = isinstance(query, str)
    if items and items_are_text != is_text:
        raise ApiError(400, "query and items must both be text or both be token ids", "items")
    if is_text:
        check_text(query, "query")
        for k, item in enumerate(items):
            check_text(item, f"items[{k}]")
    else:
        _check_token_ids(query, "query", vocab_size)
        for k, item in enumerate(items):
            _check_token_ids(item, f"items[{k}]", vocab_size)
    if req.model is not None:
        check_text(req.model, "model")  # echoed back in the response
    return ParsedRequest(is_text, query, items, list(labels), req.apply_softmax,
                         req.item_first, req.model, bool(req.apply_sigmoid))


def _check_vocabulary_labels(req: ScoreRequest, limits: Limits, vocab_size: int) -> list[int]:
    """A causal LM's label_token_ids: required, token ids of its vocabulary."""
    if req.apply_sigmoid is not None:
        raise ApiError(400, "apply_sigmoid applies to classification models only; this model "
                       "is a causal LM (apply_softmax normalises over the labels)",
                       "apply_sigmoid")
    labels = req.label_token_ids
    if not labels:
        raise ApiError(400, "label_token_ids is required and must be a nonempty list",
                       "label_token_ids")
    if len(labels) > limits.max_labels_per_request:
        raise ApiError(400, f"label_token_ids has {len(labels)} ids; the limit is "
                       f"{limits.max_labels_per_request}", "label_token_ids")
    for i, label in enumerate(labels):
        if not 0 <= label < vocab_size:
            raise ApiError(400, f"label_token_ids[{i}] = {label} is outside the vocabulary "
                           f"[0, {vocab_size})", f"label_token_ids[{i}]")
    if len(set(labels)) != len(labels):
        raise ApiError(400, "label_token_ids must not contain duplicates", "label_token_ids")
    return labels


def check_text(text: str, param: str) -> None:
    # A JSON escape can spell a lone surrogate ("\ud800"), which is not Unicode text: the
    # tokenizer raises TypeError on it and UTF-8 cannot encode it in a response (both a 500).
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(400, f"{param} has a lone surrogate (U+{ord(text[exc.start]):04X}) at "
                       f"character {exc.start}: not valid Unicode text", param) from None


def _check_token_ids(ids: list[int], param: str, vocab_size: int) -> None:
    # min and max loop in C: a request of 10,000 items × 180 ids costs ~10× less than a Python
    # loop over every id, which is then run only to name the first one outside.
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        j, token = next((j, t) for j, t in enumerate(ids) if not 0 <= t < vocab_size)
        raise ApiError(400, f"{param}[{j}] = {token} is outside the vocabulary "
                       f"[0, {vocab_size})", f"{param}[{j}]")


def check_token_count(query: list[int], items: list[list[int]], limits: Limits,
                      field: str = "items") -> int:
    total = len(query) + sum(len(item) for item in items)
    if total > limits.max_tokens_per_request:
        raise ApiError(413, f"the request has {total} tokens (query + {field}); the limit is "
                       f"{limits.max_tokens_per_request}", field)
    return total
