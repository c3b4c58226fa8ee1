"""Model fixtures for the engine tests: the real default model and tiny seeded-random checkpoints.

Tiny checkpoints are real HF folders written by transformers' own `save_pretrained` (through
tools/random_model.py), so loading them exercises our loader on exactly what HF writes
(tied/untied heads, Qwen2 biases, Qwen3 q/k-norm, llama3 RoPE scaling in `rope_parameters`).
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from gpu_worker.forward.engine import Engine
from ranker_contract.config import EngineConfig
from tools.random_model import save_random_model

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO_ROOT / "models" / "smollm2-135m-instruct"

_TINY_SHAPE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)

# name -> (config class name, extra config kwargs)
TINY_FAMILIES = {
    "llama": ("LlamaConfig", dict(head_dim=16, tie_word_embeddings=True)),
    "llama_untied": ("LlamaConfig", dict(head_dim=16, tie_word_embeddings=False)),
    "llama3_rope": (
        "LlamaConfig",
        dict(
            head_dim=16,
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
                "rope_theta": 500000.0,
            },
        ),
    ),
    # Qwen2 has no head_dim setting: hidden 64 / 4 heads = 16. Its q/k/v always carry biases.
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=False)),
    "qwen3": ("Qwen3Config", dict(head_dim=16, tie_word_embeddings=True)),
}


# name -> (config class name, extra config kwargs) of the tiny *ForSequenceClassification folders:
# one class (a reward model's head), two and three; Llama with a pad token (HF then pools at the
# last token that is not it: the tests' inputs never contain it) and an untied embedding.
TINY_CLASSIFIERS = {
    "qwen3_1class": ("Qwen3Config", dict(head_dim=16, tie_word_embeddings=True, num_labels=1)),
    "llama_3class": ("LlamaConfig", dict(head_dim=16, tie_word_embeddings=False,
                                         pad_token_id=_TINY_SHAPE["vocab_size"] - 1,
                                         id2label={0: "bad", 1: "ok", 2: "good"})),
    "qwen2_2class": ("Qwen2Config", dict(tie_word_embeddings=False, num_labels=2)),
    "llama_2class": ("LlamaConfig", dict(head_dim=16, tie_word_embeddings=False, num_labels=2)),
}


def randomize_weights(model: torch.nn.Module, std: float = 0.15) -> None:
    """Seeded weights large enough that log-probs spread out (a near-uniform head would hide
    errors) and biases clearly non-zero (HF zero-initialises them)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                torch.nn.init.normal_(param, std=std)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Factory: family name (a key of TINY_FAMILIES) -> path of a saved fp32 HF checkpoint."""
    import transformers

    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            config_cls, extra = TINY_FAMILIES[family]
            config = getattr(transformers, config_cls)(**_TINY_SHAPE, **extra)
            made[family] = save_random_model(tmp_path_factory.mktemp(f"tiny_{family}"), config,
                                             seed=1234, dtype="float32", reinit=randomize_weights)
        return made[family]

    return make


@pytest.fixture(scope="session")
def tiny_classifier(tmp_path_factory):
    """Factory: a key of TINY_CLASSIFIERS -> path of a saved fp32 HF *ForSequenceClassification
    folder (transformers' save_pretrained of a seeded model). With `tokenizer_files` (a real
    tokenizer's, to serve text) the vocabulary is `vocab_size`, the tokenizer's."""
    import transformers

    made: dict[tuple, Path] = {}

    def make(name: str, vocab_size: int | None = None, tokenizer_files=()) -> Path:
        key = (name, vocab_size)
        if key not in made:
            config_cls, extra = TINY_CLASSIFIERS[name]
            shape = dict(_TINY_SHAPE, vocab_size=vocab_size or _TINY_SHAPE["vocab_size"])
            config = getattr(transformers, config_cls)(**shape, **extra)
            made[key] = save_random_model(tmp_path_factory.mktemp(f"tiny_{name}"), config,
                                          seed=4321, dtype="float32", reinit=randomize_weights,
                                          tokenizer_files=tokenizer_files,
                                          sequence_classification=True)
        return made[key]

    return make


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    if not (DEFAULT_MODEL / "config.json").is_file():
        pytest.fail(
            f"the default model is missing at {DEFAULT_MODEL}: "
            "run `python scripts/prepare_model.py`"
        )
    return DEFAULT_MODEL


@pytest.fixture(scope="session")
def engine_for():
    """Factory: model folder -> our fp32 CPU Engine, loaded once per session."""
    engines: dict[Path, Engine] = {}

    def get(path: Path) -> Engine:
        if path not in engines:
            engines[path] = Engine.from_config(path, EngineConfig())  # fp32, CPU, torch ops
        return engines[path]

    return get


@pytest.fixture(scope="session")
def hf_model_for():
    """Factory: model folder -> HF transformers fp32 reference model, loaded once per session."""
    from transformers import AutoModelForCausalLM

    models: dict[Path, torch.nn.Module] = {}

    def get(path: Path) -> torch.nn.Module:
        if path not in models:
            models[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return models[path]

    return get


def _score_sequences(engine: Engine, sequences, label_ids: list[int]) -> list[list[list[float]]]:
    """One launch of all `sequences` as a batch; per sequence, items × label log-probs."""
    return engine.finish(engine.launch(list(sequences), [list(label_ids)] * len(sequences)))


@pytest.fixture(scope="session")
def score_sequences():
    """`score_sequences(engine, [PackedSequence, ...], label_ids)` -> per sequence, rows."""
    return _score_sequences
