"""From validated request to scores: tokenize, pack, call a scorer, turn log-probs into scores."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from serve_app.packing import PackingError, ScoreJob, merge_results, pack_request
from serve_app.protocol import ApiError
from serve_app.tokenizer import TextTokenizer
from serve_app.validate import Limits, ParsedRequest, check_token_count

# Any valid id works: nothing attends to a delimiter and its output is never read.
DELIMITER_ID = 0

ScoreFn = Callable[[ScoreJob], Awaitable[list[list[list[float]]]]]


@dataclass(frozen=True, slots=True)
class ScoreResult:
    scores: list[list[float]]
    prompt_tokens: int  # tokens sent to the model, delimiters included
    timings_ms: dict[str, float] = field(default_factory=dict)  # tokenize, pack, worker


def tokenize(req: ParsedRequest, tokenizer: TextTokenizer) -> tuple[list[int], list[list[int]]]:
    if not req.is_text:
        return req.query, req.items  # type: ignore[return-value]
    query = tokenizer.encode_query(req.query) if req.query else []  # type: ignore[arg-type]
    items = tokenizer.encode_items(req.items) if req.items else []  # type: ignore[arg-type]
    return query, items


async def score(
    req: ParsedRequest, tokenizer: TextTokenizer, limits: Limits, call_scorer: ScoreFn
) -> ScoreResult:
    started = time.perf_counter()
    if req.is_text:
        # In a thread: a megabytes-long text must not stall this replica's other requests.
        query, items = await asyncio.to_thread(tokenize, req, tokenizer)
    else:
        query, items = tokenize(req, tokenizer)
    tokenized = time.perf_counter()
    if not items:
        return ScoreResult([], 0)
    check_token_count(query, items, limits)
    try:
        sequences = pack_request(
            query, items, item_first=req.item_first, delimiter_id=DELIMITER_ID,
            max_seq_tokens=limits.max_seq_tokens, max_context=limits.max_context,
        )
    except PackingError as exc:
        raise ApiError(400, f"items[{exc.item_index}]: {exc}", f"items[{exc.item_index}]") from None
    packed = time.perf_counter()
    results = await call_scorer(ScoreJob(sequences, req.label_ids))
    scored = time.perf_counter()
    logprobs = merge_results(sequences, results, len(items))
    scores = [to_scores(row, req.apply_softmax) for row in logprobs]
    timings = {"tokenize": (tokenized - started) * 1e3, "pack": (packed - tokenized) * 1e3,
               "worker": (scored - packed) * 1e3}
    return ScoreResult(scores, sum(s.num_tokens for s in sequences), timings)


def to_scores(logprobs: list[float], apply_softmax: bool) -> list[float]:
    """false: exp(full-vocab log-prob); true: softmax over the labels (the log-normaliser cancels)."""
    if not apply_softmax:
        return [math.exp(lp) for lp in logprobs]
    top = max(logprobs)
    weights = [math.exp(lp - top) for lp in logprobs]
    total = sum(weights)
    return [w / total for w in weights]
