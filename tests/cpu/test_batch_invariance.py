"""Deterministic scores on the CPU (docs/ARCHITECTURE.md, "Deterministic scores"): every (query,
item) pair's label log-probs, scored alone, equal bit for bit what it gets in a request of many
items, in a request split over several sequences, and in batches beside other requests, in
any order. The default model, float32; queries of 8 to 60 tokens, items of 1 to 60."""

import random

import pytest

from tests.support.compositions import pack, score_batch

QUERIES, ITEMS = 4, 6
LABELS = [0, 10539, 5230]


def scores_of(engine, batch):
    return score_batch(engine, batch, LABELS)


@pytest.fixture(scope="module")
def engine(default_model_path, engine_for):
    engine = engine_for(default_model_path)
    assert engine.model.lm_head.min_rows > 1  # deterministic, the default
    return engine


def test_a_score_does_not_depend_on_its_batch(engine):
    rng = random.Random(53)
    vocab = engine.vocab_size
    queries = [[rng.randrange(vocab) for _ in range(rng.randint(8, 60))] for _ in range(QUERIES)]
    items = {(q, i): [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
             for q in range(QUERIES) for i in range(ITEMS)}

    def request(keys, max_seq_tokens=8192):
        return keys, pack(queries[keys[0][0]], [items[k] for k in keys], max_seq_tokens)

    lone = {}
    for key in items:
        lone |= scores_of(engine, [request([key])])
    by_query = [[(q, i) for i in range(ITEMS)] for q in range(QUERIES)]
    shuffled = [rng.sample(keys, len(keys)) for keys in by_query]
    halves = [request(keys[:n]) for keys in shuffled for n in [rng.randint(1, ITEMS - 1)]]
    halves += [request(keys[len(r[0]):]) for keys, r in zip(shuffled, halves)]
    rng.shuffle(halves)
    split = [request(keys, max_seq_tokens=100) for keys in by_query]
    assert all(len(seqs) >= 2 for _, seqs in split)

    compositions = {
        "each query's items in one request": [scores_of(engine, [request(keys)])
                                              for keys in by_query],
        "the same, in another order": [scores_of(engine, [request(keys)]) for keys in shuffled],
        "split over sequences of 100 tokens": [scores_of(engine, [r]) for r in split],
        "every request in one batch": [scores_of(engine, [request(k) for k in shuffled])],
        "requests of 1 to 5 items, in batches of 3": [scores_of(engine, halves[k:k + 3])
                                                     for k in range(0, len(halves), 3)],
    }
    for name, parts in compositions.items():
        got = {key: row for part in parts for key, row in part.items()}
        assert got.keys() == lone.keys(), name
        differ = [key for key in lone if got[key] != lone[key]]
        assert not differ, (name, differ[:5])
