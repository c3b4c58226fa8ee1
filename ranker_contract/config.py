"""The service's settings: the `args:` of configs/*.yaml, as one typed, frozen tree.

    AppConfig
    ├── model_path, served_model_name
    ├── limits     Limits           what one request may be (ingress; max_seq_tokens: both sides)
    ├── engine     EngineConfig     how a scorer replica computes (device, dtype, kernels)
    ├── scheduler  SchedulerConfig  how a scorer replica batches and admits work
    ├── admission  AdmissionConfig  how many requests the ingress admits per running scorer
    ├── rerank     RerankConfig     the prompt template of /v1/rerank and /v2/rerank (ingress;
    │                               the scorer too for classifier_from_labels)
    └── auth       AuthConfig       where the API keys are, when callers need one (ingress)

Every default and every check is written here once. Serve validates the YAML `args` into
AppConfig (the annotation of ranker_app.app.build_app); each side reads its part of it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

REPO_ROOT = Path(__file__).resolve().parent.parent


class _Settings(BaseModel):
    # Unknown keys are errors (Serve itself would ignore them); nothing changes after start.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Settings):
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0, description="request body")
    max_items_per_request: int = Field(1024, gt=0)
    max_labels_per_request: int = Field(64, gt=0)
    max_tokens_per_request: int = Field(65536, gt=0, description="query + all items, tokenized")
    max_seq_tokens: int = Field(8192, gt=1, description="one packed sequence; longer requests "
                                "are split at item boundaries")


class EngineConfig(_Settings):
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attention: Literal["torch", "flashinfer"] = Field(
        "torch", description="torch: SDPA + explicit multi-item mask; flashinfer: GPU")
    ops: Literal["torch", "cuda"] = Field(
        "torch", description="element-wise kernels: torch (HF's order) or cuda (fused, GPU)")
    flashinfer_backend: Literal["fa2", "fa3"] = Field(
        "fa2", description="fa2 measured faster for multi-item attention")
    fp32_residual: bool = Field(True, description="ops cuda: fp32 residual stream (more exact, "
                                "a little slower)")
    fused_gate_up: bool = Field(True, description="ops cuda, Hopper or newer: large batches run "
                                "gate_up + SwiGLU as one GEMM (same output, fewer passes)")
    torch_threads: int = Field(0, ge=0, description="CPU only; 0 = one per core")
    cuda_graphs: bool = Field(False, description="replay captured forwards for batches up to "
                              "the largest bucket (needs attention flashinfer, ops cuda)")
    precision: Literal["bf16", "fp8"] = Field(
        "bf16", description="fp8: W8A8 e4m3 linears (per-channel weights, per-token activations) "
        "on GPUs of compute capability 8.9+; changes scores: see README 'FP8'")
    fp8_linears: tuple[Literal["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], ...] = Field(
        ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
        description="precision fp8: which linears of each layer run in FP8; the rest stay bf16")
    fp8_bf16_first_layers: int = Field(0, ge=0, description="precision fp8: first layers kept bf16")
    fp8_bf16_last_layers: int = Field(0, ge=0, description="precision fp8: last layers kept bf16")
    dequantize_fp8_checkpoint: bool = Field(
        False, description="precision bf16 with an FP8 checkpoint: run its weights dequantized "
        "(e4m3 x scale) in engine.dtype; without it such a model folder is refused at start-up")
    prefix_cache_tokens: int = Field(
        0, ge=0, description="K/V of recent queries kept per replica, in tokens (all layers); "
        "a request whose query is cached computes only its items; 0 = off. Sizing: README "
        "'Prefix cache'")
    prefix_cache_min_tokens: int = Field(
        64, gt=0, description="queries shorter than this are never cached (too little to save)")
    prefix_cache_min_query_share: float = Field(
        0.2, ge=0.0, le=1.0, description="nor are queries under this share of their sequence's "
        "tokens: reading the cache costs every item row a second attention pass and a merge, "
        "more than a short query saves (README 'Prefix cache')")
    prefix_cache_page_tokens: int = Field(
        16, gt=0, description="queries are cached in pages of this many tokens: a query that "
        "starts like a cached one reuses the pages they share")
    cuda_graph_buckets: tuple[int, ...] = Field(
        (256, 512, 768, 1024, 1536, 2048, 2560, 3072, 3584, 4096),
        description="batch token sizes captured; larger batches run eagerly")

    @model_validator(mode="after")
    def _gpu_kernels_need_cuda(self) -> EngineConfig:
        for name, gpu_only in (("attention", "flashinfer"), ("ops", "cuda")):
            if getattr(self, name) == gpu_only and self.device != "cuda":
                raise ValueError(f"{name} {gpu_only!r} needs device 'cuda'")
        if self.cuda_graphs and self.ops != "cuda":
            # TorchOps copies its RoPE table to the device in every forward: not capturable.
            raise ValueError(f"engine.cuda_graphs: true needs engine.ops 'cuda', not "
                             f"{self.ops!r} (its CPU-to-CUDA copies cannot be captured)")
        if self.cuda_graphs and self.attention != "flashinfer":
            raise ValueError("engine.cuda_graphs: true needs engine.attention 'flashinfer'")
        if self.precision == "fp8" and (self.device != "cuda" or self.dtype != "bfloat16"):
            raise ValueError("engine.precision: fp8 needs engine.device 'cuda' and engine.dtype "
                             f"'bfloat16', not {self.device!r} and {self.dtype!r}")
        if any(b <= 0 for b in self.cuda_graph_buckets):
            raise ValueError("cuda_graph_buckets must be positive token counts")
        return self


class SchedulerConfig(_Settings):
    # A cap: the scorer measures free memory and passes the resolved count to its Scheduler as
    # batch_token_budget (Engine.measure_budget).
    max_batch_tokens: int = Field(8192, ge=0, description="cap on tokens per forward across "
                                  "requests; 0: derived from free GPU memory alone")
    max_batch_sequences: int = Field(256, gt=0)
    overlap: bool = Field(True, description="launch batch N+1 before finishing batch N")
    max_queued_tokens: int = Field(0, ge=0, description="per replica; a job beyond → 503; "
                                   "0 = no limit")
    max_queue_wait_s: float = Field(0, ge=0, description="a sequence not launched this long after "
                                    "it arrived is answered 503, never computed late; 0 = no bound")


class AdmissionConfig(_Settings):
    requests_per_scorer: int = Field(
        0, ge=0, description="requests the ingress replicas together hold per RUNNING scorer "
        "replica; each ingress replica admits its share, ceil(this × scorers ÷ ingress "
        "replicas), and answers one more 503 before reading it; it follows the autoscaler "
        "within a second. 0 = off: only the ingress deployment's max_ongoing_requests")


class RerankPrompt(_Settings):
    """One rerank prompt: `prefix` (with {query}, optional {instruction}) + per document
    `document` (with {document}) + `suffix`; on a causal LM the score is P(yes) / (P(yes) +
    P(no)) at the last suffix token, and each label must be exactly one token of the model
    (checked at start-up). A classification model scores with its head there instead (README,
    "Classification models"): its template may leave the labels out."""

    prefix: str
    document: str = "{document}"
    suffix: str
    yes_label: str | None = Field(None, description="required on a causal LM")
    no_label: str | None = Field(None, description="required on a causal LM")
    default_instruction: str = ""

    @model_validator(mode="after")
    def _placeholders(self) -> RerankPrompt:
        if "{query}" not in self.prefix:
            raise ValueError("rerank prefix must contain {query}")
        if self.document.count("{document}") != 1:
            raise ValueError("rerank document must contain {document} exactly once")
        if (self.yes_label is None) != (self.no_label is None):
            raise ValueError("rerank yes_label and no_label: set both (a causal LM) or neither")
        if self.yes_label is not None and self.yes_label == self.no_label:
            raise ValueError("rerank yes_label and no_label must differ")
        return self

    def label_ids(self, encode: Callable[[str], list[int]]) -> tuple[int, int]:
        """The yes and no labels as token ids of a model, `encode` being its tokenizer (no
        special tokens); each label must be exactly one token. The ingress and the scorer
        (classifier_from_labels) both resolve them here, so they agree."""
        if self.yes_label is None or self.no_label is None:
            raise ValueError("rerank.prompt.yes_label and no_label are required on a causal LM: "
                             "its relevance is P(yes) / (P(yes) + P(no))")
        ids = []
        for name, label in (("yes_label", self.yes_label), ("no_label", self.no_label)):
            tokens = encode(label)
            if len(tokens) != 1:
                raise ValueError(f"rerank {name} {label!r} is {len(tokens)} tokens {tokens} in "
                                 "this model's vocabulary; a label must be exactly one token")
            ids.append(tokens[0])
        return ids[0], ids[1]


# The Qwen3-Reranker model card's format (a chat: system, user, assistant with an empty think).
QWEN3_PROMPT = RerankPrompt(
    prefix="<|im_start|>system\nJudge whether the Document meets the requirements based on the "
    'Query and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: {instruction}\n<Query>: {query}\n<Document>: ",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    yes_label="yes",
    no_label="no",
    default_instruction="Given a web search query, retrieve relevant passages that answer "
    "the query",
)

# A generic yes/no question for ChatML instruction models (SmolLM2, Qwen2/3 instruct).
YES_NO_PROMPT = RerankPrompt(
    prefix="<|im_start|>system\nYou judge search results. Answer only yes or no.<|im_end|>\n"
    "<|im_start|>user\n{instruction}\nQuery: {query}\nDocument: ",
    suffix="\nDoes the document answer the query?<|im_end|>\n<|im_start|>assistant\n",
    yes_label="yes",
    no_label="no",
    default_instruction="Decide whether the document is relevant to the query.",
)

BUILTIN_PROMPTS = {"qwen3": QWEN3_PROMPT, "yes_no": YES_NO_PROMPT}


class RerankConfig(_Settings):
    template: Literal["yes_no", "qwen3", "custom"] = Field(
        "yes_no", description="a built-in prompt, or `custom` (then `prompt` is required)")
    prompt: RerankPrompt | None = Field(None, description="the custom template's strings")
    default_instruction: str | None = Field(
        None, description="overrides the template's default instruction; requests may override")
    classifier_from_labels: bool = Field(
        False, description="a causal LM only: at load, its LM head's yes and no rows become a "
        "one-class head, score = logit(yes) - logit(no) (vLLM's classifier_from_token): the "
        "same relevance, sigmoid(score), without the full-vocabulary log-sum-exp; the model "
        "then serves as a one-class classifier on /v1/score too")

    @model_validator(mode="after")
    def _custom_needs_prompt(self) -> RerankConfig:
        if (self.template == "custom") != (self.prompt is not None):
            raise ValueError("rerank.prompt is required with template 'custom' and only then")
        if self.classifier_from_labels and self.resolved_prompt().yes_label is None:
            raise ValueError("rerank.classifier_from_labels needs the template's yes_label and "
                             "no_label")
        return self

    def resolved_prompt(self) -> RerankPrompt:
        prompt = self.prompt if self.prompt is not None else BUILTIN_PROMPTS[self.template]
        if self.default_instruction is None:
            return prompt
        return prompt.model_copy(update={"default_instruction": self.default_instruction})


class AuthConfig(_Settings):
    """API keys (docs/ARCHITECTURE.md, "API keys"): off unless one source is named. The keys
    themselves never sit in this file's YAML; serve_app/auth.py reads and checks them."""

    api_keys_file: str | None = Field(
        None, description="a file of `id:key` lines (or `id key`; # comments); re-read when it "
        "changes; relative paths start at the repository")
    api_keys_env: str | None = Field(
        None, description="the name of an environment variable holding `id:key` entries, one "
        "per line or comma-separated; read at start-up only")

    @model_validator(mode="after")
    def _one_source(self) -> AuthConfig:
        if self.api_keys_file is not None and self.api_keys_env is not None:
            raise ValueError("auth: set api_keys_file or api_keys_env, not both")
        if self.api_keys_env == "" or self.api_keys_file == "":
            raise ValueError("auth: an empty api_keys_file or api_keys_env; leave it out instead")
        return self

    @property
    def enabled(self) -> bool:
        return self.api_keys_file is not None or self.api_keys_env is not None

    def resolved_keys_file(self) -> Path | None:
        if self.api_keys_file is None:
            return None
        path = Path(self.api_keys_file)
        return path if path.is_absolute() else REPO_ROOT / path


class AppConfig(_Settings):
    model_path: str = Field("models/smollm2-135m-instruct",
                            description="HF folder; relative paths start at the repository")
    served_model_name: str = "smollm2-135m-instruct"
    limits: Limits = Limits()
    engine: EngineConfig = EngineConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    admission: AdmissionConfig = AdmissionConfig()
    rerank: RerankConfig = RerankConfig()
    auth: AuthConfig = AuthConfig()

    @model_validator(mode="after")
    def _consistent(self) -> AppConfig:
        budget = self.scheduler.max_batch_tokens
        if 0 < budget < self.limits.max_seq_tokens:
            raise ValueError("limits.max_seq_tokens must not exceed scheduler.max_batch_tokens")
        if budget == 0 and self.engine.device != "cuda":
            raise ValueError("scheduler.max_batch_tokens = 0 (from free memory) needs "
                             "engine.device 'cuda'")
        return self

    def resolved_model_path(self) -> Path:
        path = Path(self.model_path)
        return path if path.is_absolute() else REPO_ROOT / path
