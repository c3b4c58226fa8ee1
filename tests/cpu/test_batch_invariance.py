"""Deterministic scores on the CPU (docs/ARCHITECTURE.md, "Deterministic scores"): every (query,
item) pair's label log-probs, scored alone, equal bit for bit what it gets in a request of many
items, in a request split over several sequences, and in batches beside other requests, in
any order. The default model, float32; queries of 8 to 60 tokens, items of 1 to 60.

The CPU libraries pick their kernels by the instruction sets of the machine, and MKL its split
of a GEMM between threads by the thread count, so the same check also runs in child processes
capped at each instruction-set level this machine can dispatch (torch's ATEN_CPU_CAPABILITY,
MKL's MKL_ENABLE_INSTRUCTIONS, oneDNN's ONEDNN_MAX_CPU_ISA) and at other thread counts: a run on
one machine covers the CPUs below it. `python -m tests.cpu.test_batch_invariance THREADS [MODEL]`
is that child (MODEL: another folder of the default model's shape; default: the default model)."""

import json
import os
import random
import subprocess
import sys

import pytest
import torch

from tests.support.compositions import pack, score_batch

QUERIES, ITEMS = 4, 6
LABELS = [0, 10539, 5230]
# torch's capability level → the same cap for MKL and oneDNN (their names for it)
LEVELS = {"default": ("SSE4_2", "SSE41"), "avx2": ("AVX2", "AVX2"),
          "avx512": ("AVX512", "AVX512_CORE")}


@pytest.fixture(scope="module")
def engine(default_model_path, engine_for):
    engine = engine_for(default_model_path)
    assert engine.model.model.layers[0].mlp.down_proj.chunk_rows > 0  # deterministic, the default
    return engine


def differing(engine, queries: int, items_per_query: int, seed: int = 53) -> dict:
    """{composition: the pairs whose label log-probs differ from their lone ones}."""
    rng = random.Random(seed)
    vocab = engine.vocab_size
    queries = [[rng.randrange(vocab) for _ in range(rng.randint(8, 60))] for _ in range(queries)]
    items = {(q, i): [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
             for q in range(len(queries)) for i in range(items_per_query)}

    def request(keys, max_seq_tokens=8192):
        return keys, pack(queries[keys[0][0]], [items[k] for k in keys], max_seq_tokens)

    def scores_of(batch):
        return score_batch(engine, batch, LABELS)

    lone = {}
    for key in items:
        lone |= scores_of([request([key])])
    by_query = [[(q, i) for i in range(items_per_query)] for q in range(len(queries))]
    shuffled = [rng.sample(keys, len(keys)) for keys in by_query]
    halves = [request(keys[:n]) for keys in shuffled for n in [rng.randint(1, len(keys) - 1)]]
    halves += [request(keys[len(r[0]):]) for keys, r in zip(shuffled, halves)]
    rng.shuffle(halves)
    split = [request(keys, max_seq_tokens=100) for keys in by_query]
    assert all(len(seqs) >= 2 for _, seqs in split)

    compositions = {
        "each query's items in one request": [scores_of([request(keys)]) for keys in by_query],
        "the same, in another order": [scores_of([request(keys)]) for keys in shuffled],
        "split over sequences of 100 tokens": [scores_of([r]) for r in split],
        "every request in one batch": [scores_of([request(k) for k in shuffled])],
        "requests of 1 to 5 items, in batches of 3": [scores_of(halves[k:k + 3])
                                                     for k in range(0, len(halves), 3)],
    }
    differ = {}
    for name, parts in compositions.items():
        got = {key: row for part in parts for key, row in part.items()}
        assert got.keys() == lone.keys(), name
        differ[name] = [key for key in lone if got[key] != lone[key]]
    return differ


def test_a_score_does_not_depend_on_its_batch(engine):
    differ = differing(engine, QUERIES, ITEMS)
    assert not any(differ.values()), {name: keys[:5] for name, keys in differ.items() if keys}


def levels_here() -> list[str]:
    """The capability levels this machine dispatches: DEFAULT up to its own."""
    top = torch.backends.cpu.get_cpu_capability().lower()
    order = list(LEVELS)
    return order[:order.index(top) + 1] if top in order else ["default"]


def child_runs() -> list[tuple[str, int]]:
    """(level, threads): every level at this machine's thread count (os.cpu_count(), what the
    engine takes by default), and its own level at 1 and 4 threads (MKL splits a GEMM by the
    thread count)."""
    levels, threads = levels_here(), os.cpu_count() or 1
    return ([(level, threads) for level in levels]
            + [(levels[-1], n) for n in (1, 4) if n != threads])


@pytest.mark.parametrize(("level", "threads"), child_runs())
def test_the_same_at_each_instruction_set_and_thread_count(default_model_path, level, threads):
    mkl, onednn = LEVELS[level]
    env = {**os.environ, "ATEN_CPU_CAPABILITY": level, "MKL_ENABLE_INSTRUCTIONS": mkl,
           "ONEDNN_MAX_CPU_ISA": onednn}
    run = subprocess.run([sys.executable, "-m", "tests.cpu.test_batch_invariance",
                          str(threads)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    child = json.loads(run.stdout.splitlines()[-1])
    assert child["capability"] == level.upper()  # the cap took effect
    assert child["threads"] == threads
    assert not any(child["differ"].values()), child["differ"]


if __name__ == "__main__":  # the child: a smaller set of pairs, one JSON line
    from gpu_worker.forward.engine import Engine
    from ranker_contract.config import EngineConfig
    from tests.cpu.conftest import DEFAULT_MODEL

    threads = int(sys.argv[1])
    model = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_MODEL
    engine = Engine.from_config(model, EngineConfig(torch_threads=threads))
    differ = differing(engine, queries=2, items_per_query=4, seed=530)
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(),
                      "threads": torch.get_num_threads(),
                      "differ": {name: [list(k) for k in keys] for name, keys in differ.items()}}))
