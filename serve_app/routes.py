"""What differs between /v1/score and /v1|v2/rerank: how a request body becomes a multi-item
request (prefix, items, label ids) and how the merged log-probs become the response body.

The ingress runs the steps the routes share (docs/ARCHITECTURE.md, "The request path"):
parse → tokenize → pack → await a scorer → merge → respond, each step timed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from ranker_contract.calibration import CalibrationMap
from ranker_contract.config import Limits
from serve_app.classifier import class_scores, classifier_relevance, rerank_classes
from serve_app.protocol import ApiError, RerankRequest, ScoreResponse, Usage
from serve_app.rerank import (
    RerankInput,
    RerankPrompter,
    aggregate,
    build_response,
    check_rerank,
    relevance,
)
from serve_app.scoring import to_scores, tokenize
from serve_app.tokenizer import TextTokenizer
from serve_app.validate import ParsedRequest, as_schema, check_request

# The routes by their HTTP paths: the request paths' keys, the metrics' `route` label.
SCORE, RERANK_V1, RERANK_V2 = "/v1/score", "/v1/rerank", "/v2/rerank"
ROUTES = (SCORE, RERANK_V1, RERANK_V2)  # the routes ScoreIngress._observed wraps


@dataclass(frozen=True, slots=True)
class Tokenized:
    """A request in the terms of the packing contract (ranker_contract/packing.py)."""

    prefix: list[int]
    items: list[list[int]]
    label_ids: list[int]
    from_text: bool  # tokenized here (timed as tokenize_ms), not sent as token ids
    item_first: bool = False
    truncated: int = 0  # rerank documents cut short on the client's request
    documents: list[int] | None = None  # rerank: each item's document (None: item k is doc k)
    capped: int = 0  # rerank documents with chunks past max_chunks_per_doc, left unread
    spans: list[tuple[int, int]] | None = None  # rerank with return_chunks: RerankTokens.spans


class ScoreRoute:
    """/v1/score, SGLang's body: the request names its label ids; one score per label. On a
    classifier (`num_labels` classes) the labels are class indices (serve_app/classifier.py)."""

    field = "items"  # the request field an item's error names: items[k]

    def __init__(self, limits: Limits, vocab_size: int, tokenizer: TextTokenizer,
                 model_name: str, num_labels: int | None = None) -> None:
        self.limits, self.vocab_size, self.num_labels = limits, vocab_size, num_labels
        self.tokenizer, self.model_name = tokenizer, model_name

    def parse(self, body: dict) -> ParsedRequest:
        """`body`: the JSON object (serve_app/validate.py::read_body).

        NOTE: the body is checked by hand so that every malformed input becomes a 4xx with the
        field named, instead of FastAPI's 422 list."""
        return check_request(as_schema(body), self.limits, self.vocab_size, self.num_labels)

    async def tokenize(self, req: ParsedRequest) -> Tokenized:
        if req.is_text:
            # In a thread: a megabytes-long text must not stall this replica's other requests.
            return await asyncio.to_thread(self.tokenize_now, req)
        return self.tokenize_now(req)

    def tokenize_now(self, req: ParsedRequest) -> Tokenized:
        query, items = tokenize(req, self.tokenizer)
        return Tokenized(query, items, req.label_ids, from_text=req.is_text,
                         item_first=req.item_first)

    def respond(self, req: ParsedRequest, tokenized: Tokenized, logprobs: list[list[float]],
                prompt_tokens: int, calibration: CalibrationMap | None = None) -> dict:
        """The labels' (or classes') scores as asked for: never calibrated (a calibration map
        is of the rerank relevance)."""
        if self.num_labels is None:
            scores = [to_scores(row, req.apply_softmax) for row in logprobs]
        else:  # the rows are class logits
            scores = [class_scores(row, req.apply_softmax, req.apply_sigmoid) for row in logprobs]
        return ScoreResponse(
            scores=scores,
            model=req.model or self.model_name,
            usage=Usage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens),
        ).model_dump()


class RerankRoute:
    """/v1/rerank or /v2/rerank, Cohere's body: the configured prompt template and its two
    labels (a causal LM) or the head's one or two classes (a classifier of `num_labels`
    classes: serve_app/classifier.py); one relevance score per document, sorted."""

    field = "documents"

    def __init__(self, prompter: RerankPrompter, default_instruction: str, limits: Limits,
                 model_name: str, api_version: str, num_labels: int | None = None) -> None:
        self.prompter, self.default_instruction = prompter, default_instruction
        self.limits, self.model_name, self.api_version = limits, model_name, api_version
        self.num_labels = num_labels
        if num_labels is None:
            self.label_ids, self.relevance = prompter.label_ids, relevance
        else:  # None with more than two classes: parse() refuses every request
            self.label_ids, self.relevance = rerank_classes(num_labels), classifier_relevance

    def parse(self, body: dict) -> RerankInput:
        req = check_rerank(as_schema(body, RerankRequest), self.limits, self.default_instruction)
        if self.label_ids is None:
            raise ApiError(400, f"this model is a classifier of {self.num_labels} classes: a "
                           "rerank relevance needs one class (its sigmoid) or two (class 1's "
                           "probability); use /v1/score for the class scores")
        return req

    async def tokenize(self, req: RerankInput) -> Tokenized:
        # In a thread, as for /v1/score: long documents must not stall other requests.
        return await asyncio.to_thread(self.tokenize_now, req)

    def tokenize_now(self, req: RerankInput) -> Tokenized:
        tokens = self.prompter.tokenize(req)
        if len(tokens.items) > self.limits.max_items_per_request:
            raise ApiError(413, f"the {len(req.documents)} documents make {len(tokens.items)} "
                           f"chunks; the limit is {self.limits.max_items_per_request} per "
                           "request (max_tokens_per_doc or max_chunks_per_doc lower it)",
                           "documents")
        return Tokenized(tokens.prefix, tokens.items, self.label_ids, from_text=True,
                         truncated=tokens.truncated, documents=tokens.documents,
                         capped=tokens.capped, spans=tokens.spans)

    def respond(self, req: RerankInput, tokenized: Tokenized, logprobs: list[list[float]],
                prompt_tokens: int, calibration: CalibrationMap | None = None) -> dict:
        """With a `calibration` map, relevance_score is the calibrated relevance and raw_score
        the model's (the map is monotone: the best chunk and the order are the raw ones')."""
        documents = (tokenized.documents if tokenized.documents is not None
                     else range(len(logprobs)))
        scores, best, chunks = aggregate([self.relevance(row) for row in logprobs], documents,
                                         len(req.documents), req.aggregation, req.top_k)
        raw = None
        if calibration is not None:
            raw, scores = scores, calibration.apply(np.array(scores)).tolist()
        return build_response(req, scores, prompt_tokens, tokenized.truncated, self.api_version,
                              req.model or self.model_name, best=best, chunks=chunks,
                              spans=tokenized.spans, capped=tokenized.capped, raw_scores=raw)


Route = ScoreRoute | RerankRoute
