"""Multi-item scoring equals scoring each item alone (docs/ARCHITECTURE.md), using our engine only.

Item k of `Q D I_1 D ... D I_n D` must score like the plain sequence `Q + I_k`: the mask hides the
other items, and positions restart after the query for every item.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from gpu_worker.forward.engine import Engine
from ranker_contract.packing import merge_results, pack_multi_item, pack_plain, pack_request

# fp32 noise floor: on the 30-layer real model, merely batching the same plain sequences
# differently (other GEMM shapes) already moves log-probs near -12 by up to ~2e-5.
TOL = {"qwen3": 1e-5, "default": 5e-5}
QUERY_LEN = 30
ITEM_LENS = (7, 0, 15, 1, 3, 10)


# Scores (apply_softmax=false) are exp(log-prob): these must agree within 1e-5 on every model.
SCORE_TOL = 1e-5


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def max_score_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max_diff([[math.exp(x) for x in r] for r in a], [[math.exp(x) for x in r] for r in b])


@dataclass
class Setup:
    engine: Engine
    query: list[int]
    items: list[list[int]]
    labels: list[int]
    delimiter: int
    tol: float


@pytest.fixture(scope="module", params=["default", "qwen3"])
def setup(request, default_model_path, tiny_checkpoint, engine_for) -> Setup:
    path = default_model_path if request.param == "default" else tiny_checkpoint(request.param)
    engine = engine_for(path)
    rng = random.Random(f"multi-item-{request.param}")
    vocab = engine.vocab_size
    query = [rng.randrange(vocab) for _ in range(QUERY_LEN)]
    items = [[rng.randrange(vocab) for _ in range(n)] for n in ITEM_LENS]
    labels = [0, 10539, 5230] if request.param == "default" else [0, 7, vocab - 1]
    return Setup(engine, query, items, labels, rng.randrange(vocab), TOL[request.param])


@pytest.fixture(scope="module")
def one_at_a_time(setup, score_sequences):
    """Reference: every `Q + I_k` scored alone, one launch each."""
    return [score_sequences(setup.engine, [pack_plain(setup.query + item, k)], setup.labels)[0][0]
            for k, item in enumerate(setup.items)]


def test_multi_item_equals_one_at_a_time(setup: Setup, one_at_a_time, score_sequences):
    seq = pack_multi_item(setup.query, setup.items, setup.delimiter)
    (rows,) = score_sequences(setup.engine, [seq], setup.labels)
    assert max_diff(rows, one_at_a_time) <= setup.tol
    assert max_score_diff(rows, one_at_a_time) <= SCORE_TOL


def test_item_order_does_not_matter(setup: Setup, one_at_a_time, score_sequences):
    seq = pack_multi_item(setup.query, setup.items[::-1], setup.delimiter)
    (rows,) = score_sequences(setup.engine, [seq], setup.labels)
    assert max_diff(rows[::-1], one_at_a_time) <= setup.tol


def test_items_would_differ_if_they_saw_each_other(setup: Setup, one_at_a_time, score_sequences):
    """Control: the packed tokens read as one causal sequence give other scores, so the two
    tests above would catch a mask or position that lets items see each other."""
    seq = pack_multi_item(setup.query, setup.items, setup.delimiter)
    causal = pack_plain(seq.input_ids[: seq.score_rows[-1] + 1], 0)
    (rows,) = score_sequences(setup.engine, [causal], setup.labels)
    assert max_diff(rows, one_at_a_time[-1:]) > 1e-3


def test_split_request_merges_back(setup: Setup, one_at_a_time, score_sequences):
    # Room for the query and about two items per sequence; the 15-token item fits no
    # multi-item sequence (30 + 1 + 15 + 1 > 46) and falls back to a plain one.
    sequences = pack_request(setup.query, setup.items, item_first=False,
                             delimiter_id=setup.delimiter, max_seq_tokens=46, max_context=8192)
    assert len(sequences) >= 3
    assert any(seq.prefix_len == seq.num_tokens for seq in sequences)  # plain fallback covered
    assert all(seq.num_tokens <= 46 for seq in sequences)
    results = score_sequences(setup.engine, sequences, setup.labels)
    merged = merge_results(sequences, results, len(setup.items))

    unsplit = pack_multi_item(setup.query, setup.items, setup.delimiter)
    (unsplit_rows,) = score_sequences(setup.engine, [unsplit], setup.labels)
    assert max_diff(merged, unsplit_rows) <= setup.tol
    assert max_diff(merged, one_at_a_time) <= setup.tol
