"""The steps of a score request between validation and the scorer, as plain functions:
tokenize, pack (with the token-count limit), and log-probs to scores (a classifier's logits
to scores: serve_app/classifier.py)."""

from __future__ import annotations

import math

from ranker_contract.config import Limits
from ranker_contract.packing import PackedSequence, PackingError, pack_request
from serve_app.classifier import softmax
from serve_app.protocol import ApiError
from serve_app.tokenizer import TextTokenizer
from serve_app.validate import ParsedRequest, check_token_count

# Any valid id works: nothing attends to a delimiter and its output is never read.
DELIMITER_ID = 0


def tokenize(req: ParsedRequest, tokenizer: TextTokenizer) -> tuple[list[int], list[list[int]]]:
    if not req.is_text:
        return req.query, req.items  # type: ignore[return-value]
    query = tokenizer.encode_query(req.query) if req.query else []  # type: ignore[arg-type]
    items = tokenizer.encode_items(req.items) if req.items else []  # type: ignore[arg-type]
    return query, items


def pack(query: list[int], items: list[list[int]], limits: Limits, max_context: int, *,
         item_first: bool = False, field: str = "items") -> list[PackedSequence]:
    """The request's sequences (ranker_contract/packing.py); limits are 413/400 naming the item
    as `field[k]`."""
    check_token_count(query, items, limits, field)
    try:
        return pack_request(
            query, items, item_first=item_first, delimiter_id=DELIMITER_ID,
            max_seq_tokens=limits.max_seq_tokens, max_context=max_context,
        )
    except PackingError as exc:
        param = f"{field}[{exc.item_index}]"
        raise ApiError(400, f"{param}: {exc}", param) from None


def to_scores(logprobs: list[float], apply_softmax: bool) -> list[float]:
    """false: exp(full-vocab log-prob); true: softmax over the labels (the log-normaliser
    cancels)."""
    if not apply_softmax:
        return [math.exp(lp) for lp in logprobs]
    return softmax(logprobs)
