"""GPU fixtures: a Qwen3-0.6B-shaped model with seeded random bf16 weights and the real Qwen3
tokenizer, made on first use by `python -m tools.random_model`. Every test here is marked gpu and
skipped without CUDA."""

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ranker_contract.packing import pack_plain, pack_request
from tools import REPO_ROOT
from tools.random_model import SHAPES

YES, NO = 9454, 2753  # "Yes", "No" in the Qwen3 vocabulary
LABELS = [YES, NO]
VOCAB = 151643  # ids below this are ordinary tokens


def run_batch(engine, sequences, labels=LABELS, eager=False):
    """One batch of `sequences` through Engine.launch + finish: per sequence, items × labels.
    `eager`: never a CUDA graph (as a batch too large for one runs)."""
    return engine.finish(engine.launch(sequences, [labels] * len(sequences), eager=eager))


def launch_checking_no_host_sync(engine, sequences, labels=LABELS):
    """Engine.launch with torch's sync debug mode on "error" (after a warm-up batch: the first
    plan or JIT may allocate): a host sync on the launch path raises. Returns the Step."""
    label_ids = [labels] * len(sequences)
    engine.finish(engine.launch(sequences, label_ids))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return engine.launch(sequences, label_ids)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def ids(rng, n):
    return [rng.randrange(VOCAB) for _ in range(n)]


def graph_batches(rng):
    """Named batch compositions users send, each small enough for a captured bucket (the
    CUDA-graph tests, bf16 and fp8)."""
    def request(query_len, item_lens, item_first=False):
        return pack_request(ids(rng, query_len), [ids(rng, n) for n in item_lens],
                            item_first=item_first, delimiter_id=0, max_seq_tokens=4096,
                            max_context=32768)

    return {
        "one item": request(120, [180]),
        "one-token items": request(30, [1] * 40),
        "empty query (one plain sequence per item)": request(0, [300] * 10),
        "item_first": request(20, [50, 7, 90], item_first=True),
        "mixed lengths": request(120, [180, 1, 0, 57, 180, 3, 99, 180, 12, 30]),
        "two requests": request(64, [100] * 5) + request(10, [40, 3, 200]),
        "exactly a bucket": [pack_plain(ids(rng, 1024), 0)],
        "plain and multi-item": [pack_plain(ids(rng, 77), 0)] + request(50, [60, 60]),
        # 250 items each reading a 1,000-token query: the most page indices per token
        "long query, 250 one-token items": request(1000, [1] * 250),
        # 15,448 tokens: the largest default bucket (16,384), which batches under load replay
        "eight bench requests": [s for _ in range(8) for s in request(120, [180] * 10)],
    }


def softmax(row):
    top = max(row)
    w = [math.exp(x - top) for x in row]
    return [x / sum(w) for x in w]


def worst_difference(a, b):
    """(max |Δ log-prob|, max |Δ softmax score|) over every item of every sequence."""
    lp = p = 0.0
    for s1, s2 in zip(a, b, strict=True):
        for r1, r2 in zip(s1, s2, strict=True):
            lp = max(lp, *(abs(x - y) for x, y in zip(r1, r2)))
            p = max(p, *(abs(x - y) for x, y in zip(softmax(r1), softmax(r2))))
    return lp, p


def scheduled(engine, sequences, overlap, batch_token_budget=4096):
    """Results of `sequences` through the scheduling loop, all queued before it starts (so the
    batches are the same in every run), in submission order."""
    from gpu_worker.serving.scheduler import Scheduler, ScoreTask
    from ranker_contract.config import SchedulerConfig

    results = {}
    scheduler = Scheduler(engine, SchedulerConfig(max_batch_sequences=64, overlap=overlap),
                          batch_token_budget=batch_token_budget)
    for i, seq in enumerate(sequences):
        scheduler.submit(ScoreTask(seq, LABELS, lambda r, i=i: results.__setitem__(i, r)))
    scheduler.start()
    try:
        for _ in range(600):
            if len(results) == len(sequences):
                break
            time.sleep(0.05)
    finally:
        scheduler.stop()
    assert scheduler.batches_run > 2
    return [results[i] for i in range(len(sequences))]


def pytest_collection_modifyitems(items):
    # The Triton kernel test also runs on CPU under TRITON_INTERPRET=1 (a development aid).
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            kernel_only = item.fspath.basename == "test_triton_kernels.py"
            if not torch.cuda.is_available() and not (interpreted and kernel_only):
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


def random_model_folder(shape: str) -> Path:
    """models/<SHAPES[shape].folder>, made by `python -m tools.random_model` on first use."""
    path = REPO_ROOT / "models" / SHAPES[shape].folder
    if not (path / "config.json").is_file():
        # In its own process: what initialising it reserves on the GPU would stay in this one's
        # CUDA allocator and shrink the memory the engines here size their budget from.
        subprocess.run([sys.executable, "-m", "tools.random_model", "--shape", shape,
                        "--out", str(path)], cwd=REPO_ROOT, check=True)
    return path


@pytest.fixture(scope="session")
def qwen3_path() -> Path:
    return random_model_folder("0.6b")


@pytest.fixture(scope="session")
def fast_engine(qwen3_path):
    """The shipped GPU engine without graphs or cache: bf16, FlashInfer, the fused kernels."""
    from gpu_worker.forward.engine import Engine
    from ranker_contract.config import EngineConfig

    return Engine.from_config(qwen3_path, EngineConfig(device="cuda"))

