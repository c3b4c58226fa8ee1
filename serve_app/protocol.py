"""HTTP schemas: /v1/score (SGLang-compatible), /v1/rerank and /v2/rerank (Cohere- and
Jina-compatible), and the OpenAI-style error envelope."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

TokenIds = list[StrictInt]


# How a document of several chunks scores (serve_app/rerank.py::aggregate).
ChunkAggregation = Literal["max", "mean", "top_k_mean"]


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: StrictStr | TokenIds | None = Field(
        default=None,
        description="Text, or token ids. Shared by every item. Omitted means empty.",
    )
    items: StrictStr | list[StrictStr] | list[TokenIds] | None = Field(
        default=None,
        description="Text (one string or a list), or a list of token-id lists; same kind as query.",
    )
    label_token_ids: list[StrictInt] | None = Field(
        default=None, description="Causal LM (required): token ids whose probabilities are "
        "returned, in this order. Classification model: class indices, in this order; every "
        "class when omitted.",
    )
    apply_softmax: StrictBool = Field(
        default=False,
        description="false: full-vocabulary probability of each label (causal LM), or the raw "
        "class logits (classification model); true: softmax over the listed labels or classes "
        "only, per item.",
    )
    apply_sigmoid: StrictBool | None = Field(
        default=None, description="Classification models only: true returns the sigmoid of "
        "each class logit (e.g. a one-class reward or relevance score as a probability).",
    )
    item_first: StrictBool = Field(
        default=False, description="Score item + query instead of query + item."
    )
    model: StrictStr | None = Field(default=None, description="Echoed back in the response.")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(BaseModel):
    scores: list[list[float]]
    model: str
    usage: Usage
    object: Literal["scoring"] = "scoring"


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: StrictStr


class RerankRequest(BaseModel):
    """Cohere's v2 body, plus v1's `return_documents` and `{"text": ...}` documents (both
    routes accept both), plus `instruction` (this service's)."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = Field(default=None, description="Echoed back in the response.")
    query: StrictStr | None = Field(default=None, description="Required.")
    documents: list[StrictStr | RerankDocument] | None = Field(
        default=None, description='Required: strings, or objects {"text": string}.')
    top_n: StrictInt | None = Field(
        default=None, ge=1, description="Return the best n results; all when omitted.")
    return_documents: StrictBool = Field(
        default=False, description="Add `document: {text}` to each result.")
    max_tokens_per_doc: StrictInt | None = Field(
        default=None, ge=1, description="Truncate each document to this many tokens. Without "
        "it a document too long for the model is an error (nothing is truncated silently).")
    max_chunks_per_doc: StrictInt | None = Field(
        default=None, ge=1, description="Cohere v1's: score at most this many chunks of a long "
        "document (the rest is not read); documents × max_chunks_per_doc ≤ 10,000.")
    truncate: StrictBool = Field(
        default=False, description="TEI's: a document longer than fits is cut to fit, one "
        "pass, instead of scored in chunks.")
    truncation_direction: Literal["Right", "Left", "right", "left"] = Field(
        default="Right", description="TEI's: with truncate, Right keeps a document's start, "
        "Left its end.")
    instruction: StrictStr | None = Field(
        default=None, description="Replaces the configured default instruction of the prompt.")
    return_chunks: StrictBool = Field(
        default=False, description="Add `chunk: {index, start, end}` to each result: the "
        "document's best-scoring chunk and the characters of the document it covers.")
    chunk_aggregation: ChunkAggregation = Field(
        default="max", description="A document of several chunks scores its best chunk's "
        "relevance (max, Cohere's), the mean over its chunks, or the mean of its chunk_top_k "
        "best.")
    chunk_top_k: StrictInt | None = Field(
        default=None, ge=1, description="top_k_mean's k (default 3; a document of fewer chunks "
        "takes the mean of all).")


RERANK_EXAMPLE = {
    "model": "smollm2-135m-instruct",
    "query": "What is the capital of France?",
    "documents": ["Paris is the capital and largest city of France.",
                  "Bananas are rich in potassium."],
    "top_n": 1,
    "return_documents": True,
}


class RerankChunk(BaseModel):
    index: int  # from 0, in the document's order
    start: int  # the characters of the document its tokens cover: text[start:end], a
    end: int  # word's leading space not counted


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None  # only with return_documents
    best_chunk: int | None = None  # a document scored in chunks: its best-scoring one
    chunk: RerankChunk | None = None  # only with return_chunks
    # with a calibration map (AppConfig.calibration): the model's relevance, relevance_score
    # being the calibrated one
    raw_score: float | None = None


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    meta: dict = Field(description="api_version, billed_units, tokens, truncated_documents")
    usage: dict = Field(description="Jina's shape: {total_tokens}")


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorBody


class ApiError(Exception):
    """A client-visible error: HTTP status, message and the request field it concerns."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers

    @property
    def kind(self) -> str:
        return {
            400: "BadRequestError",
            401: "AuthenticationError",
            404: "NotFoundError",
            408: "RequestTimeoutError",
            413: "RequestTooLargeError",
            422: "UnprocessableEntityError",
            429: "RateLimitError",
            503: "ServiceUnavailableError",
        }.get(self.status, "InternalServerError" if self.status >= 500 else "BadRequestError")

    def envelope(self) -> dict:
        return {"error": {"message": _utf8_safe(self.message), "type": self.kind,
                          "param": None if self.param is None else _utf8_safe(self.param),
                          "code": self.status}}


def _utf8_safe(text: str) -> str:
    # Errors can quote the request (a duplicated key), and a JSON escape can spell a lone
    # surrogate ("\ud800") that the UTF-8 response cannot encode (a 500): write it escaped.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
