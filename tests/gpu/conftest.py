"""GPU fixtures: a Qwen3-0.6B-shaped model with seeded random bf16 weights and the real Qwen3
tokenizer, made on first use by scripts/make_random_model.py. Every test here is marked gpu and
skipped without CUDA."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
QWEN3_PATH = REPO / "models" / "qwen3-0.6b-random"
YES, NO = 9454, 2753  # "Yes", "No" in the Qwen3 vocabulary


def pytest_collection_modifyitems(items):
    # The Triton kernel test also runs on CPU under TRITON_INTERPRET=1 (a development aid).
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            kernel_only = item.fspath.basename == "test_triton_kernels.py"
            if not torch.cuda.is_available() and not (interpreted and kernel_only):
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


@pytest.fixture(scope="session")
def qwen3_path() -> Path:
    if not (QWEN3_PATH / "config.json").is_file():
        subprocess.run([sys.executable, str(REPO / "scripts" / "make_random_model.py"),
                        "--out", str(QWEN3_PATH)], check=True)
    return QWEN3_PATH


@pytest.fixture(scope="session")
def fast_engine(qwen3_path):
    """bf16, FlashInfer attention (fa2) and the fused element-wise kernels."""
    from gpu_worker.engine import Engine
    from ranker_contract.config import EngineConfig

    return Engine.from_config(qwen3_path, EngineConfig(
        device="cuda", dtype="bfloat16", attention="flashinfer", ops="cuda"))
