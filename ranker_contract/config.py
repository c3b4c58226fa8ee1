"""The service's settings: the `args:` of configs/*.yaml, as one typed, frozen tree.

    AppConfig
    ├── model_path, served_model_name
    ├── adapters, lora  LoRA adapters of the model, and how a replica holds them
    ├── models, multiplex  other full models, and how many a replica holds besides the model
    ├── limits     Limits           what one request may be (ingress; max_seq_tokens: both sides)
    ├── engine     EngineConfig     how a scorer replica computes (device, dtype, kernels)
    ├── scheduler  SchedulerConfig  how a scorer replica batches and admits work
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

from ranker_contract.calibration import CalibrationMap, load_calibrations

REPO_ROOT = Path(__file__).resolve().parent.parent


def from_repository(path: str) -> Path:
    """A configured path: absolute as given, relative from the repository's root."""
    return Path(path) if Path(path).is_absolute() else REPO_ROOT / path


class _Settings(BaseModel):
    # Unknown keys are errors (Serve itself would ignore them); nothing changes after start.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Settings):
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0, description="request body")
    max_items_per_request: int = Field(10_000, gt=0, description="items, or rerank document "
                                       "chunks (Cohere's limit)")
    max_labels_per_request: int = Field(64, gt=0)
    max_tokens_per_request: int = Field(1 << 20, gt=0, description="query + all items, "
                                        "tokenized")
    max_seq_tokens: int = Field(8192, gt=1, description="one packed sequence; longer requests "
                                "are split at item boundaries")


FP8_LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class Fp8Config(_Settings):
    """engine.fp8: which linears run in FP8 under precision fp8 (docs/OPERATIONS.md, "FP8"),
    and what a precision bf16 engine does with an FP8 checkpoint."""

    linears: tuple[Literal["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], ...] = Field(
        FP8_LINEARS, description="which linears of each layer run in FP8; the rest stay bf16")
    bf16_first_layers: int = Field(0, ge=0, description="first decoder layers kept bf16")
    bf16_last_layers: int = Field(0, ge=0, description="last decoder layers kept bf16")
    dequantize_checkpoint: bool = Field(
        False, description="precision bf16 with an FP8 checkpoint: run its weights dequantized "
        "(e4m3 x scale); without it such a model folder is refused at start-up")


class CudaGraphsConfig(_Settings):
    enabled: bool = Field(False, description="replay captured forwards for batches up to the "
                          "largest bucket (device cuda)")
    token_buckets: tuple[int, ...] = Field(
        (256, 512, 768, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192,
         10240, 12288, 14336, 16384),
        description="batch token sizes captured (each at most 25% over the one below: a batch "
        "is padded up to the next); larger batches run eagerly")

    @model_validator(mode="after")
    def _positive(self) -> CudaGraphsConfig:
        if not self.token_buckets or any(b <= 0 for b in self.token_buckets):
            raise ValueError("engine.cuda_graphs.token_buckets must be positive token counts")
        return self


class PrefixCacheConfig(_Settings):
    tokens: int = Field(
        0, ge=0, description="K/V of recent queries kept per replica, in tokens (all layers); "
        "a request whose query is cached computes only its items; 0 = off. Sizing: "
        "docs/OPERATIONS.md, 'Prefix cache'")
    min_tokens: int = Field(
        64, gt=0, description="queries shorter than this are never cached (too little to save)")
    min_query_share: float = Field(
        0.2, ge=0.0, le=1.0, description="nor are queries under this share of their sequence's "
        "tokens: reading the cache costs a copy of the batch's K/V and the cached rows at every "
        "layer, more than a short query saves")
    page_tokens: int = Field(
        16, gt=0, description="queries are cached in pages of this many tokens: a query that "
        "starts like a cached one reuses the pages they share")

    @property
    def enabled(self) -> bool:
        return self.tokens > 0


# Keys an older config may still hold: where each went (a start-up error says so).
MOVED_ENGINE_KEYS = {
    "cuda_graph_buckets": "engine.cuda_graphs.token_buckets",
    "prefix_cache_tokens": "engine.prefix_cache.tokens",
    "prefix_cache_min_tokens": "engine.prefix_cache.min_tokens",
    "prefix_cache_min_query_share": "engine.prefix_cache.min_query_share",
    "prefix_cache_page_tokens": "engine.prefix_cache.page_tokens",
    "fp8_linears": "engine.fp8.linears",
    "fp8_bf16_first_layers": "engine.fp8.bf16_first_layers",
    "fp8_bf16_last_layers": "engine.fp8.bf16_last_layers",
    "dequantize_fp8_checkpoint": "engine.fp8.dequantize_checkpoint",
}
REMOVED_ENGINE_KEYS = {
    "dtype": "the device sets it: bfloat16 on cuda, float32 on cpu",
    "attention": "the device sets it: FlashInfer on cuda, torch SDPA on cpu",
    "ops": "the device sets it: fused kernels on cuda, torch ops on cpu",
    "flashinfer_backend": "FlashInfer's fa2 backend always runs (measured faster than fa3 here)",
    "fp32_residual": "the residual stream is always fp32 on cuda",
    "fused_gate_up": "the fused gate/up kernel runs wherever the GPU has TMA (Hopper or newer)",
}


class EngineConfig(_Settings):
    """How a scorer replica computes. The product's axes only: precision × CUDA graphs × prefix
    cache (× the model's head); everything else follows from the device."""

    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="cuda: bf16 weights, FlashInfer attention, fused kernels, an fp32 "
        "residual stream; cpu: float32 and torch ops (development, CI)")
    precision: Literal["bf16", "fp8"] = Field(
        "bf16", description="fp8: W8A8 e4m3 linears (per-channel weights, per-token "
        "activations) on GPUs of compute capability 8.9+; changes scores: docs/OPERATIONS.md, "
        "'FP8'. bf16 on cpu runs float32")
    fp8: Fp8Config = Fp8Config()
    cuda_graphs: CudaGraphsConfig = CudaGraphsConfig()
    prefix_cache: PrefixCacheConfig = PrefixCacheConfig()
    deterministic: bool = Field(
        True, description="an item's score does not depend on what it is batched with "
        "(docs/OPERATIONS.md, 'Deterministic scores'); false lets FlashInfer pick its tiles "
        "and split a small batch's attention per batch (a third more items/s on items of ~10 "
        "tokens) and runs linears of few rows unpadded")
    torch_threads: int = Field(0, ge=0, description="cpu only; 0 = one per core")

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data):
        if isinstance(data, dict):
            for key in data:
                if key in MOVED_ENGINE_KEYS:
                    raise ValueError(f"engine.{key} moved to {MOVED_ENGINE_KEYS[key]}")
                if key in REMOVED_ENGINE_KEYS:
                    raise ValueError(f"engine.{key} was removed: {REMOVED_ENGINE_KEYS[key]}")
            if isinstance(data.get("cuda_graphs"), bool):
                raise ValueError("engine.cuda_graphs is a section now: cuda_graphs: {enabled: "
                                 f"{str(data['cuda_graphs']).lower()}}}")
        return data

    @model_validator(mode="after")
    def _needs_cuda(self) -> EngineConfig:
        if self.cuda_graphs.enabled and self.device != "cuda":
            raise ValueError("engine.cuda_graphs.enabled: true needs engine.device 'cuda'")
        if self.precision == "fp8" and self.device != "cuda":
            raise ValueError("engine.precision: fp8 needs engine.device 'cuda' (FP8 tensor "
                             "cores); use precision bf16 on cpu")
        return self

    @property
    def dtype(self) -> str:
        """The weights' and activations' float type, a torch dtype name."""
        return "bfloat16" if self.device == "cuda" else "float32"


class SchedulerConfig(_Settings):
    # A cap: the scorer measures free memory and passes the resolved count to its Scheduler as
    # batch_token_budget (gpu_worker/forward/startup.py::measure_budget).
    max_batch_tokens: int = Field(8192, ge=0, description="cap on tokens per forward across "
                                  "requests; 0: derived from free GPU memory alone")
    max_batch_sequences: int = Field(256, gt=0)
    overlap: bool = Field(True, description="launch batch N+1 before finishing batch N")
    max_queue_wait_s: float = Field(
        0, ge=0, description="the load bound (docs/ARCHITECTURE.md, 'Load control'): a job that "
        "could not start within it at the replica's measured throughput is answered 503 at "
        "once, and one that waited longer anyway too, never computed late; 0 = no bound")
    bulk_floor_share: float = Field(
        0.1, ge=0, le=1, description="while bulk work (keys with priority=bulk) waits, the "
        "share of each batch's token budget it takes ahead of online work, so that it is never "
        "starved (docs/OPERATIONS.md, 'Priorities'); the rest of the batch is online work's "
        "first")

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data):
        if isinstance(data, dict) and "max_queued_tokens" in data:
            raise ValueError(REMOVED["scheduler.max_queued_tokens"])
        return data


# Settings that went away, and what replaced them: a config that still sets one fails at start.
REMOVED = {
    "scheduler.max_queued_tokens": "scheduler.max_queued_tokens was removed: the queue is bounded "
    "in seconds of the measured throughput by scheduler.max_queue_wait_s (docs/ARCHITECTURE.md, "
    "'Load control')",
    "admission": "admission (requests_per_scorer) was removed: each scorer refuses what could not "
    "start within scheduler.max_queue_wait_s, and the ingress sheds before reading a request "
    "while the scorers refuse (docs/ARCHITECTURE.md, 'Load control')",
}


class RerankPrompt(_Settings):
    """One rerank prompt: `prefix` (with {query}, optional {instruction}) + per document
    `document` (with {document}) + `suffix`; on a causal LM the score is P(yes) / (P(yes) +
    P(no)) at the last suffix token, and each label must be exactly one token of the model
    (checked at start-up). A classification model scores with its head there instead
    (docs/API.md, "Models"): its template may leave the labels out."""

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


class RerankPromptChoice(_Settings):
    """Which rerank prompt: a built-in one or a custom one, and its default instruction."""

    template: Literal["yes_no", "qwen3", "custom"] = Field(
        "yes_no", description="a built-in prompt, or `custom` (then `prompt` is required)")
    prompt: RerankPrompt | None = Field(None, description="the custom template's strings")
    default_instruction: str | None = Field(
        None, description="overrides the template's default instruction; requests may override")

    @model_validator(mode="after")
    def _custom_needs_prompt(self) -> RerankPromptChoice:
        if (self.template == "custom") != (self.prompt is not None):
            raise ValueError("rerank.prompt is required with template 'custom' and only then")
        return self

    def resolved_prompt(self) -> RerankPrompt:
        prompt = self.prompt if self.prompt is not None else BUILTIN_PROMPTS[self.template]
        if self.default_instruction is None:
            return prompt
        return prompt.model_copy(update={"default_instruction": self.default_instruction})


class RerankConfig(RerankPromptChoice):
    chunk_overlap_tokens: int = Field(
        0, ge=0, description="a document longer than fits is scored in chunks, its score the "
        "best chunk's (docs/API.md, \"Long documents\"); each chunk repeats this many tokens "
        "of the one before (at most half a chunk)")
    max_query_tokens: int = Field(2048, gt=0, description="a longer query is a 400 (Cohere's "
                                  "limit)")
    classifier_from_labels: bool = Field(
        False, description="a causal LM only: at load, its LM head's yes and no rows become a "
        "one-class head, score = logit(yes) - logit(no) (vLLM's classifier_from_token): the "
        "same relevance, sigmoid(score), without the full-vocabulary log-sum-exp; the model "
        "then serves as a one-class classifier on /v1/score too")

    @model_validator(mode="after")
    def _labels_for_the_head(self) -> RerankConfig:
        if self.classifier_from_labels and self.resolved_prompt().yes_label is None:
            raise ValueError("rerank.classifier_from_labels needs the template's yes_label and "
                             "no_label")
        return self


class AuthConfig(_Settings):
    """API keys (docs/ARCHITECTURE.md, "API keys"): off unless one source is named. The keys
    themselves never sit in this file's YAML; serve_app/auth.py reads and checks them."""

    api_keys_file: str | None = Field(
        None, description="a file of `id:key` lines (or `id key`; # comments); re-read when it "
        "changes; relative paths start at the repository")
    api_keys_env: str | None = Field(
        None, description="the name of an environment variable holding `id:key` entries, one "
        "per line or comma-separated; read at start-up only")
    shared_cache: dict[str, list[str]] = Field(
        {}, description="groups of key ids whose requests share one prefix cache (one team, "
        "several keys), by a group name; every other key's cached queries are its own")

    @model_validator(mode="after")
    def _one_source(self) -> AuthConfig:
        if self.api_keys_file is not None and self.api_keys_env is not None:
            raise ValueError("auth: set api_keys_file or api_keys_env, not both")
        if self.api_keys_env == "" or self.api_keys_file == "":
            raise ValueError("auth: an empty api_keys_file or api_keys_env; leave it out instead")
        seen: dict[str, str] = {}
        for group, ids in self.shared_cache.items():
            for key_id in ids:
                if key_id in seen:
                    raise ValueError(f"auth.shared_cache: key id {key_id!r} is in both "
                                     f"{seen[key_id]!r} and {group!r}")
                seen[key_id] = group
        if self.shared_cache and not self.enabled:
            raise ValueError("auth.shared_cache names key ids, but no API keys are configured")
        return self

    def cache_owner(self, key_id: str | None) -> str:
        """Whose prefix-cache entries a request of key `key_id` reads and fills
        (docs/OPERATIONS.md, "API keys"): its shared_cache group's, else the key's own; "" with
        auth off (one tenant). Groups and keys are told apart, so neither can name the other's."""
        if not self.enabled or key_id is None:
            return ""
        for group, ids in self.shared_cache.items():
            if key_id in ids:
                return f"group {group}"
        return f"key {key_id}"

    @property
    def enabled(self) -> bool:
        return self.api_keys_file is not None or self.api_keys_env is not None

    def resolved_keys_file(self) -> Path | None:
        return None if self.api_keys_file is None else from_repository(self.api_keys_file)


class AdapterConfig(_Settings):
    """One LoRA adapter of the served model, chosen by a request's `model` (docs/API.md,
    "Several rankers")."""

    name: str = Field(min_length=1, description="what a request's `model` names it by")
    path: str = Field(description="a peft folder (adapter_config.json + "
                      "adapter_model.safetensors); relative paths start at the repository")
    rerank: RerankPromptChoice | None = Field(
        None, description="its own rerank prompt (template, prompt, default_instruction), where "
        "it was trained on another than the model's (`rerank`)")


class LoraConfig(_Settings):
    """How each scorer replica holds the adapters (docs/API.md, "Several rankers")."""

    slots: int = Field(8, ge=1, le=256, description="adapters held on each replica's GPU at "
                       "once: the first ones listed load at start, any other on first use in "
                       "place of the least recently used idle one")
    max_rank: int = Field(16, ge=1, le=256, description="the largest `r` of any adapter; each "
                          "slot's memory and compute are sized for it")


class ModelEntry(_Settings):
    """Another full model served beside `model_path`, chosen by a request's `model`: its own
    tokenizer, head and rerank prompt, the app's `engine`, `scheduler` and `limits`
    (docs/API.md, "Several rankers")."""

    name: str = Field(min_length=1, description="what a request's `model` names it by")
    path: str = Field(description="an HF model folder; relative paths start at the repository")
    rerank: RerankConfig | None = Field(
        None, description="its rerank prompt and chunking; none: the app's `rerank`")


class MultiplexConfig(_Settings):
    """How each scorer replica holds the full models of `models` (Ray Serve's model
    multiplexing: docs/API.md, "Several rankers")."""

    max_models_per_replica: int = Field(
        1, ge=1, description="models of `models` one replica holds at once besides `model_path`: "
        "one loads on its first request there, in place of the least recently used; each holds "
        "its own share of the replica's GPU memory: 1 / (1 + this)")
    preload: tuple[str, ...] = Field(
        (), description="models of `models` every replica loads at start, before it reports "
        "ready, so that their first requests wait for no load (at most max_models_per_replica)")


class AppConfig(_Settings):
    model_path: str = Field("models/smollm2-135m-instruct",
                            description="HF folder; relative paths start at the repository")
    served_model_name: str = "smollm2-135m-instruct"
    adapters: list[AdapterConfig] = Field(
        [], description="LoRA adapters of the model; a request's `model` picks one (none: the "
        "model itself)")
    lora: LoraConfig = LoraConfig()
    models: list[ModelEntry] = Field(
        [], description="other full models served beside model_path; a request's `model` picks "
        "one, which a replica loads on first use")
    multiplex: MultiplexConfig = MultiplexConfig()
    limits: Limits = Limits()
    engine: EngineConfig = EngineConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    rerank: RerankConfig = RerankConfig()
    auth: AuthConfig = AuthConfig()
    calibration: str | None = Field(
        None, description="a calibration file written by python -m ranker_batch.calibrate: "
        "rerank answers of the models and adapters it has a map for give the calibrated "
        "relevance as relevance_score and the model's as raw_score (docs/OPERATIONS.md, "
        "\"Calibration\"); relative paths start at the repository")

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data):
        if isinstance(data, dict) and "admission" in data:
            raise ValueError(REMOVED["admission"])
        return data

    @model_validator(mode="after")
    def _consistent(self) -> AppConfig:
        budget = self.scheduler.max_batch_tokens
        if 0 < budget < self.limits.max_seq_tokens:
            raise ValueError("limits.max_seq_tokens must not exceed scheduler.max_batch_tokens")
        if budget == 0 and self.engine.device != "cuda":
            raise ValueError("scheduler.max_batch_tokens = 0 (from free memory) needs "
                             "engine.device 'cuda'")
        names = self.served_names
        if len(set(names)) < len(names):
            raise ValueError(f"adapters and models: every name must differ from the others "
                             f"and from served_model_name: {names}")
        unknown = [n for n in self.multiplex.preload if n not in {m.name for m in self.models}]
        if unknown:
            raise ValueError(f"multiplex.preload: {unknown} not among the names of `models`")
        if len(self.multiplex.preload) > self.multiplex.max_models_per_replica:
            raise ValueError("multiplex.preload: more models than "
                             "multiplex.max_models_per_replica holds")
        if self.rerank.classifier_from_labels and any(a.rerank for a in self.adapters):
            raise ValueError("adapters: a rerank prompt of an adapter's own needs "
                             "rerank.classifier_from_labels off (the head is the model's yes "
                             "and no rows)")
        return self

    @property
    def model_names(self) -> list[str]:
        """What a request's `model` may name: the model, then each adapter (its number: the
        index here)."""
        return [self.served_model_name, *(a.name for a in self.adapters)]

    @property
    def served_names(self) -> list[str]:
        """Every name a request's `model` may give: model_names, then each of `models`."""
        return [*self.model_names, *(m.name for m in self.models)]

    def multiplexed(self, name: str) -> AppConfig:
        """The configuration one of `models` is served with: this one with its folder, name and
        rerank prompt, without adapters or other models (its calibration map, if any, comes
        from this configuration's calibrations())."""
        entry = next(m for m in self.models if m.name == name)
        return self.model_copy(update={
            "model_path": str(from_repository(entry.path)), "served_model_name": entry.name,
            "rerank": entry.rerank or self.rerank, "adapters": [], "models": [],
            "calibration": None})

    def calibrations(self) -> dict[str, CalibrationMap]:
        """The calibration file's maps by the name they calibrate ({} without one); a file that
        cannot be read, or with a map for a name not served, is a ValueError."""
        if self.calibration is None:
            return {}
        return load_calibrations(from_repository(self.calibration), self.served_names)

    @property
    def memory_share(self) -> float:
        """The share of a replica's free GPU memory each engine's batches may use: all of it with
        one model; with `models`, model_path's and each multiplexed one's equal shares."""
        return 1.0 / (1 + self.multiplex.max_models_per_replica) if self.models else 1.0

    def resolved_adapter_paths(self) -> list[Path]:
        return [from_repository(a.path) for a in self.adapters]

    def resolved_model_path(self) -> Path:
        return from_repository(self.model_path)
