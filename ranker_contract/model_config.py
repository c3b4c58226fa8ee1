"""The decoder's shape and its head, read from an HF config.json (Llama, Qwen2 and Qwen3 families):
a causal LM (`*ForCausalLM`: the LM head over the vocabulary) or a sequence classifier
(`*ForSequenceClassification`: a `score` head of `num_labels` classes; docs/ARCHITECTURE.md,
"Classification heads")."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
CAUSAL_LM_SUFFIX = "ForCausalLM"
CLASSIFIER_SUFFIX = "ForSequenceClassification"
# HF's own default when a config names no labels (PretrainedConfig.num_labels)
HF_DEFAULT_NUM_LABELS = 2


class ModelFolderError(ValueError):
    """The model folder is missing or cannot be served; the message says what to do."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # llama3-style frequency scaling, or None
    max_position_embeddings: int
    attention_bias: bool  # q/k/v biases (always on for Qwen2)
    qk_norm: bool  # per-head RMSNorm on q and k (Qwen3)
    tie_word_embeddings: bool
    # None: a causal LM. Otherwise a sequence classifier with this many classes, named by
    # `class_names` (HF's id2label, in class order).
    num_labels: int | None = None
    class_names: tuple[str, ...] = ()

    @property
    def is_classifier(self) -> bool:
        return self.num_labels is not None

    def with_label_head(self) -> ModelConfig:
        """This causal LM as it serves with rerank.classifier_from_labels: a one-class
        classifier whose head is its LM head's yes row minus its no row."""
        if self.is_classifier:
            raise ModelFolderError("rerank.classifier_from_labels turns a causal LM's label rows "
                                   "into a head; this model is a classifier already")
        return dataclasses.replace(self, num_labels=1, class_names=("yes - no",))

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise ModelFolderError(f"no config.json in {folder}")
        return cls.from_dict(json.loads(path.read_text()))

    @classmethod
    def from_dict(cls, cfg: dict) -> ModelConfig:
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelFolderError(
                f"model_type {model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}"
            )
        # transformers 5 nests rope settings in rope_parameters; 4.x keeps rope_theta/rope_scaling.
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ModelFolderError(f"rope_type {rope_type!r} is not supported (default, llama3)")
        heads = cfg["num_attention_heads"]
        num_labels, class_names = _head(cfg)
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10000.0)),
            rope_scaling=rope if rope_type == "llama3" else None,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            attention_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=model_type == "qwen3",
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            num_labels=num_labels,
            class_names=class_names,
        )


def _head(cfg: dict) -> tuple[int | None, tuple[str, ...]]:
    """(None, ()) for a causal LM; (classes, their names) for a sequence classifier."""
    architectures = cfg.get("architectures") or []
    arch = architectures[0] if architectures else ""
    if not arch or arch.endswith(CAUSAL_LM_SUFFIX):
        return None, ()  # a config without architectures has always been read as a causal LM
    if not arch.endswith(CLASSIFIER_SUFFIX):
        raise ModelFolderError(f"architecture {arch!r} is not supported: a *{CAUSAL_LM_SUFFIX} "
                               f"or *{CLASSIFIER_SUFFIX} model is needed")
    id2label = cfg.get("id2label") or {}
    num_labels = len(id2label) or cfg.get("num_labels") or HF_DEFAULT_NUM_LABELS
    names = tuple(str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}")))
                  for i in range(num_labels))
    return num_labels, names
