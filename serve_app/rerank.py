"""/v1/rerank and /v2/rerank between validation and the scorer: the prompt template, its
tokenization into the multi-item contract, and the response.

A request becomes `prefix D doc_1+suffix D ... D doc_n+suffix D`: the rendered prefix (query
and instruction) is the shared query of ranker_contract/packing.py, and each item is one
document's tokens followed by the suffix's tokens, so each item's score row is its last suffix
token, where the model says yes or no (a classification model's head reads that row instead:
serve_app/classifier.py).
"""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass

from ranker_contract.config import Limits, RerankPrompt
from serve_app.classifier import sigmoid
from serve_app.protocol import ApiError, RerankDocument, RerankRequest, RerankResult
from serve_app.tokenizer import TextTokenizer
from serve_app.validate import check_text

_PLACEHOLDER = re.compile(r"\{(query|instruction)\}")
# Cohere bills one search unit per 100 documents.
DOCS_PER_SEARCH_UNIT = 100


@dataclass(frozen=True, slots=True)
class RerankInput:
    query: str
    documents: list[str]
    instruction: str
    top_n: int | None
    return_documents: bool
    max_tokens_per_doc: int | None
    model: str | None


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
    return RerankInput(req.query, documents, instruction, req.top_n, req.return_documents,
                       req.max_tokens_per_doc, req.model)


class RerankPrompter:
    """The configured template, with its fixed parts and label ids tokenized once.
    `label_tokens`: resolve the yes/no labels to token ids (a causal LM; a classifier's head
    needs none: then `label_ids` is None)."""

    def __init__(self, prompt: RerankPrompt, tokenizer: TextTokenizer, *,
                 label_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
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

    def tokenize(self, req: RerankInput) -> tuple[list[int], list[list[int]], int]:
        """(prefix ids, items = document ids + suffix ids, number of truncated documents)."""
        prefix, lead = self.render_prefix(req.query, req.instruction)
        prefix_ids = self.tokenizer.encode_query(prefix)
        if not req.documents:
            return prefix_ids, [], 0
        # Each document is tokenized together with the text after it: BPE may join a
        # document's last characters with the suffix's first (".\n" is one Qwen token), and the
        # joined prompt text is what the model reads.
        items = self.tokenizer.encode_items([lead + d + self._after for d in req.documents])
        truncated = 0
        if req.max_tokens_per_doc is not None:
            docs = self.tokenizer.encode_items([lead + d for d in req.documents])
            for k, doc in enumerate(docs):
                if len(doc) > req.max_tokens_per_doc:
                    items[k] = doc[:req.max_tokens_per_doc] + self.suffix_ids
                    truncated += 1
        return prefix_ids, items, truncated


def relevance(yes_no_logprobs: list[float]) -> float:
    """P(yes) / (P(yes) + P(no)) from the two label log-probs, computed stably."""
    yes, no = yes_no_logprobs
    return sigmoid(yes - no)


def build_response(req: RerankInput, scores: list[float], prompt_tokens: int, truncated: int,
                   api_version: str, model: str) -> dict:
    """Cohere's response (sorted by score, ties by index; top_n) plus Jina's `usage`."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    if req.top_n is not None:
        order = order[:req.top_n]
    results = [RerankResult(index=i, relevance_score=scores[i],
                            document=RerankDocument(text=req.documents[i])
                            if req.return_documents else None).model_dump(exclude_none=True)
               for i in order]
    meta = {
        "api_version": {"version": api_version},
        "billed_units": {"search_units": max(1, math.ceil(len(scores) / DOCS_PER_SEARCH_UNIT))},
        "tokens": {"input_tokens": prompt_tokens, "output_tokens": 0},
        "truncated_documents": truncated,
    }
    if truncated:
        meta["warnings"] = [f"{truncated} documents were truncated to max_tokens_per_doc="
                            f"{req.max_tokens_per_doc} tokens"]
    return {"id": str(uuid.uuid4()), "model": model, "results": results, "meta": meta,
            "usage": {"total_tokens": prompt_tokens}}
