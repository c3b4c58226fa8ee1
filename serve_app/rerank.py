"""/v1/rerank and /v2/rerank between validation and the scorer: the prompt template, its
tokenization into the multi-item contract, and the response.

A request becomes `prefix D doc_1+suffix D ... D doc_n+suffix D`: the rendered prefix (query
and instruction) is the shared query of ranker_contract/packing.py, and each item is one
document's tokens followed by the suffix's tokens, so each item's score row is its last suffix
token, where the model says yes or no (a classification model's head reads that row instead:
serve_app/classifier.py).

A document too long for the model's window (with the prefix and suffix) is scored in chunks,
as Cohere's Rerank does: consecutive slices of its tokens, each an item of the same packed
sequences, the document's score the best chunk's (docs/API.md, "Long documents").
`max_tokens_per_doc` truncates before chunking, `max_chunks_per_doc` caps the chunks, and
`truncate` (TEI's) cuts the document to fit instead.
"""

from __future__ import annotations

import itertools
import math
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from ranker_contract.config import Limits, RerankPrompt
from serve_app.classifier import sigmoid
from serve_app.protocol import (
    ApiError,
    ChunkAggregation,
    RerankChunk,
    RerankDocument,
    RerankRequest,
    RerankResult,
)
from serve_app.tokenizer import TextTokenizer
from serve_app.validate import check_text

_PLACEHOLDER = re.compile(r"\{(query|instruction)\}")
# Cohere bills one search unit per 100 documents.
DOCS_PER_SEARCH_UNIT = 100
# Cohere v1 refuses documents × max_chunks_per_doc above this.
MAX_DOCUMENT_CHUNKS = 10_000
DEFAULT_TOP_K = 3


@dataclass(frozen=True, slots=True)
class RerankInput:
    query: str
    documents: list[str]
    instruction: str
    top_n: int | None
    return_documents: bool
    max_tokens_per_doc: int | None
    model: str | None
    max_chunks_per_doc: int | None = None
    truncate: bool = False
    keep_end: bool = False  # truncate's direction: keep the end (TEI's Left), else the start
    return_chunks: bool = False
    aggregation: ChunkAggregation = "max"  # a document's score from its chunks'
    top_k: int = DEFAULT_TOP_K  # top_k_mean's


def check_rerank(req: RerankRequest, limits: Limits, default_instruction: str) -> RerankInput:
    """Everything that can be checked before tokenization."""
    if req.query is None:
        raise ApiError(400, "query is required", "query")
    if req.documents is None:
        raise ApiError(400, "documents is required", "documents")
    if len(req.documents) > limits.max_items_per_request:
        raise ApiError(413, f"{len(req.documents)} documents; the limit is "
                       f"{limits.max_items_per_request} per request", "documents")
    documents = [d.text if isinstance(d, RerankDocument) else d for d in req.documents]
    check_text(req.query, "query")
    for i, doc in enumerate(documents):
        check_text(doc, f"documents[{i}]")
    instruction = default_instruction if req.instruction is None else req.instruction
    check_text(instruction, "instruction")
    if req.model is not None:
        check_text(req.model, "model")
    if (req.max_chunks_per_doc is not None
            and len(documents) * req.max_chunks_per_doc > MAX_DOCUMENT_CHUNKS):
        raise ApiError(400, f"{len(documents)} documents × max_chunks_per_doc="
                       f"{req.max_chunks_per_doc} is more than {MAX_DOCUMENT_CHUNKS} chunks",
                       "max_chunks_per_doc")
    if req.chunk_top_k is not None and req.chunk_aggregation != "top_k_mean":
        raise ApiError(400, "chunk_top_k is the k of chunk_aggregation \"top_k_mean\"; "
                       f"this request aggregates by {req.chunk_aggregation!r}", "chunk_top_k")
    return RerankInput(req.query, documents, instruction, req.top_n, req.return_documents,
                       req.max_tokens_per_doc, req.model, req.max_chunks_per_doc, req.truncate,
                       req.truncation_direction.lower() == "left", req.return_chunks,
                       req.chunk_aggregation, req.chunk_top_k or DEFAULT_TOP_K)


@dataclass(frozen=True, slots=True)
class RerankTokens:
    """A request's prefix and items, with each item's document: one document may be several
    chunks, each its own item."""

    prefix: list[int]
    items: list[list[int]]
    documents: list[int]  # per item, the index of its document
    truncated: int = 0  # documents cut short: max_tokens_per_doc, truncate
    capped: int = 0  # documents with chunks past max_chunks_per_doc, left unread
    # with return_chunks, per item: the characters of its document it covers (RerankChunk)
    spans: list[tuple[int, int]] | None = None


class RerankPrompter:
    """The configured template, with its fixed parts and label ids tokenized once.
    `label_tokens`: resolve the yes/no labels to token ids (a causal LM; a classifier's head
    needs none: then `label_ids` is None). `window`: the most tokens of prefix + one item (the
    model's context, and a packed sequence's length); a longer document is scored in chunks,
    each repeating `chunk_overlap` tokens of the one before (at most half a chunk). Without a
    window nothing is chunked (packing then refuses what does not fit)."""

    def __init__(self, prompt: RerankPrompt, tokenizer: TextTokenizer, *,
                 label_tokens: bool = True, window: int | None = None, chunk_overlap: int = 0,
                 max_query_tokens: int = 2048) -> None:
        self.tokenizer = tokenizer
        self.window, self.chunk_overlap = window, chunk_overlap
        self.max_query_tokens = max_query_tokens
        before, after = prompt.document.split("{document}")
        self._prefix_template = prompt.prefix + before
        self._after = after + prompt.suffix  # the text after each document
        self.suffix_ids = tokenizer.encode_items([self._after])[0]
        self.label_ids: list[int] | None = None
        if not label_tokens:
            return
        self.label_ids = list(prompt.label_ids(lambda label: tokenizer.encode_items([label])[0]))

    def render_prefix(self, query: str, instruction: str) -> tuple[str, str]:
        """(prefix text, spaces that start every document).

        Trailing spaces of the prefix move onto the documents: byte-level BPE joins a space
        with the next word (": " + "Paris" is ":" + " Paris"), so this keeps the tokens of the
        joined prompt text. (One pass of re.sub: a query may itself contain "{instruction}".)
        """
        values = {"query": query, "instruction": instruction}
        text = _PLACEHOLDER.sub(lambda m: values[m[1]], self._prefix_template)
        stripped = text.rstrip(" ")
        return stripped, text[len(stripped):]

    def tokenize(self, req: RerankInput) -> RerankTokens:
        """The prefix, and per document one item (document + suffix ids) or, past the window,
        one per chunk; the query's own length is checked against Cohere's limit first."""
        query_tokens = len(self.tokenizer.encode_query(req.query))
        if query_tokens > self.max_query_tokens:
            raise ApiError(400, f"query is {query_tokens} tokens; the limit is "
                           f"{self.max_query_tokens}", "query")
        prefix, lead = self.render_prefix(req.query, req.instruction)
        prefix_ids = self.tokenizer.encode_query(prefix)
        if not req.documents:
            return RerankTokens(prefix_ids, [], [])
        room = (None if self.window is None  # document tokens per item
                else self.window - len(prefix_ids) - len(self.suffix_ids))
        if room is not None and room < 1:
            raise ApiError(400, f"query and the prompt template are {len(prefix_ids)} tokens "
                           f"(+ {len(self.suffix_ids)} after each document): no room for a "
                           f"document in the model's window of {self.window}", "query")
        # Each document is tokenized together with the text after it: BPE may join a
        # document's last characters with the suffix's first (".\n" is one Qwen token), and the
        # joined prompt text is what the model reads. A document cut or chunked is its own
        # tokens, then the suffix's.
        joined = self.tokenizer.encode_items([lead + d + self._after for d in req.documents])
        long = [k for k, item in enumerate(joined) if req.max_tokens_per_doc
                or (room is not None and len(item) > room + len(self.suffix_ids))]
        texts = [lead + req.documents[k] for k in long]
        # return_chunks: each token's characters, to say which part of a document a chunk is
        offsets = {}
        if req.return_chunks:
            encoded = self.tokenizer.encode_items_with_offsets(texts)
            offsets = {k: offs for k, (_, offs) in zip(long, encoded)}
            alone = {k: ids for k, (ids, _) in zip(long, encoded)}
        else:
            alone = dict(zip(long, self.tokenizer.encode_items(texts)))
        items, documents, pieces, truncated, capped = [], [], [], 0, 0
        for k, item in enumerate(joined):
            doc, first = alone.get(k), 0  # first: where doc starts in the document's tokens
            piece = None  # the part of the document the item holds (None: all of it)
            if doc is not None:
                cut = req.max_tokens_per_doc is not None and len(doc) > req.max_tokens_per_doc
                if cut:
                    doc = doc[:req.max_tokens_per_doc]
                over = room is not None and len(doc) > room
                if over and req.truncate:
                    first = len(doc) - room if req.keep_end else 0
                    doc, cut = doc[first:first + room], True
                truncated += cut
                if over and not req.truncate:
                    starts = self._chunk_starts(len(doc), room)
                    if req.max_chunks_per_doc and len(starts) > req.max_chunks_per_doc:
                        starts = starts[:req.max_chunks_per_doc]
                        capped += 1
                    items.extend(doc[s:s + room] + self.suffix_ids for s in starts)
                    documents.extend([k] * len(starts))
                    pieces.extend((k, s, min(s + room, len(doc))) for s in starts)
                    continue
                # Cut, or joined with the suffix one token too long for the window: apart.
                if cut or (room is not None and len(item) > room + len(self.suffix_ids)):
                    item, piece = doc + self.suffix_ids, (k, first, first + len(doc))
            items.append(item)
            documents.append(k)
            pieces.append(piece)
        spans = None
        if req.return_chunks:
            spans = [(0, len(req.documents[documents[i]])) if piece is None
                     else _span(req.documents[piece[0]], offsets[piece[0]], len(lead), *piece[1:])
                     for i, piece in enumerate(pieces)]
        return RerankTokens(prefix_ids, items, documents, truncated, capped, spans)

    def _chunk_starts(self, tokens: int, room: int) -> list[int]:
        """Where each chunk of a document of `tokens` tokens starts (each `room` long, the
        last one shorter)."""
        step = room - min(self.chunk_overlap, room // 2)
        return list(range(0, max(tokens - room, 0) + step, step))


def _span(text: str, offsets: list[tuple[int, int]], lead: int, first: int, end: int
          ) -> tuple[int, int]:
    """The characters of `text` that its tokens first..end-1 cover (`offsets`: of lead + text,
    `lead` characters before it); a leading space belongs to its word's token and is left out."""
    start, stop = max(offsets[first][0] - lead, 0), max(offsets[end - 1][1] - lead, 0)
    while start < stop and text[start].isspace():
        start += 1
    return start, stop


def relevance(yes_no_logprobs: list[float]) -> float:
    """P(yes) / (P(yes) + P(no)) from the two label log-probs, computed stably."""
    yes, no = yes_no_logprobs
    return sigmoid(yes - no)


def aggregate(item_scores: list[float], documents: Sequence[int], n_documents: int,
              how: ChunkAggregation = "max", top_k: int = DEFAULT_TOP_K
              ) -> tuple[list[float], list[int], list[int]]:
    """Each document's score from its chunks' (`how`: the best one's, their mean, or the mean of
    the `top_k` best), which chunk (from 0) scored best, and how many chunks it has."""
    chunks: list[list[float]] = [[] for _ in range(n_documents)]
    for score, doc in zip(item_scores, documents, strict=True):
        chunks[doc].append(score)
    best = [max(range(len(c)), key=c.__getitem__) for c in chunks]  # the first of ties
    counts = [len(c) for c in chunks]
    if how == "max":
        return [c[b] for c, b in zip(chunks, best)], best, counts
    if how == "mean":
        return [math.fsum(c) / len(c) for c in chunks], best, counts
    tops = [sorted(c, reverse=True)[:top_k] for c in chunks]
    return [math.fsum(t) / len(t) for t in tops], best, counts


def build_response(req: RerankInput, scores: list[float], prompt_tokens: int, truncated: int,
                   api_version: str, model: str, *, best: list[int] | None = None,
                   chunks: list[int] | None = None, spans: list[tuple[int, int]] | None = None,
                   capped: int = 0, raw_scores: list[float] | None = None) -> dict:
    """Cohere's response (sorted by score, ties by index; top_n) plus Jina's `usage`. Per
    document, `best`: its best chunk, named (`best_chunk`) where it has several (`chunks`:
    how many); `spans`: per item, with return_chunks (RerankTokens.spans). `raw_scores`: the
    model's relevance where `scores` are calibrated (`raw_score`)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    if req.top_n is not None:
        order = order[:req.top_n]
    first = list(itertools.accumulate(chunks, initial=0)) if chunks else None  # first items

    def result(i: int) -> dict:
        several = chunks is not None and chunks[i] > 1
        chunk = None
        if spans is not None:
            start, end = spans[first[i] + best[i]]
            chunk = RerankChunk(index=best[i], start=start, end=end)
        return RerankResult(index=i, relevance_score=scores[i],
                            best_chunk=best[i] if several else None, chunk=chunk,
                            raw_score=None if raw_scores is None else raw_scores[i],
                            document=RerankDocument(text=req.documents[i])
                            if req.return_documents else None).model_dump(exclude_none=True)

    results = [result(i) for i in order]
    meta = {
        "api_version": {"version": api_version},
        "billed_units": {"search_units": max(1, math.ceil(len(scores) / DOCS_PER_SEARCH_UNIT))},
        "tokens": {"input_tokens": prompt_tokens, "output_tokens": 0},
        "truncated_documents": truncated,
    }
    warnings = []
    if truncated:
        warnings.append(f"{truncated} documents were truncated (max_tokens_per_doc or "
                        "truncate)")
    if capped:
        warnings.append(f"{capped} documents had more than max_chunks_per_doc="
                        f"{req.max_chunks_per_doc} chunks: the rest of each was not scored")
    if warnings:
        meta["warnings"] = warnings
    return {"id": str(uuid.uuid4()), "model": model, "results": results, "meta": meta,
            "usage": {"total_tokens": prompt_tokens}}
