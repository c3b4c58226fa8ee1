"""HTTP schema of /v1/score (SGLang-compatible) and the OpenAI-style error envelope."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

TokenIds = list[StrictInt]


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
        default=None, description="Token ids whose probabilities are returned, in this order."
    )
    apply_softmax: StrictBool = Field(
        default=False,
        description="false: full-vocabulary probability of each label; "
        "true: softmax over the labels only, per item.",
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
            404: "NotFoundError",
            413: "RequestTooLargeError",
            422: "UnprocessableEntityError",
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
