"""The FP8 fidelity tool (tools/fidelity.py): the labelled pydoc set it scores and its
metrics, on hand-made examples whose answers are worked out here."""

import math

import pytest

from ranker_contract.config import Fp8Config
from tools.fidelity import (
    compare,
    kendall_tau,
    ndcg_at_10,
    parse_setting,
    random_mrr,
    random_ndcg_at_10,
    reciprocal_rank,
    recommend,
    same_top1,
)
from tools.fidelity_set import AVAILABLE, all_sections, labelled_requests


@pytest.fixture(scope="module")
def pydoc_set():
    return labelled_requests(AVAILABLE)


def test_the_pydoc_set_has_1000_requests_of_10_to_50_items_with_a_relevant_one(pydoc_set):
    assert AVAILABLE >= 1000 and len(pydoc_set) == AVAILABLE
    for r in pydoc_set:
        assert 10 <= len(r.documents) <= 50
        assert len(set(r.documents)) == len(r.documents)
        assert 1 <= len(r.relevant) <= 3 and all(0 <= i < len(r.documents) for i in r.relevant)
        assert r.query.endswith(("?", ".")) and "Python" in r.query
    assert len({r.query for r in pydoc_set[:len(all_sections())]}) == len(all_sections())


def test_relevant_documents_are_the_sections_own_and_distractors_other_topics():
    sections = {(s.topic, s.title): s for s in all_sections()}
    by_topic = {}
    for s in sections.values():
        by_topic.setdefault(s.topic, set()).update(s.passages)
    for r in labelled_requests(100, items=12):
        assert len(r.documents) == 12
        own = sections[(r.topic, r.section)].passages
        for i, doc in enumerate(r.documents):
            assert 20 <= len(doc.split()) <= 120
            if i in r.relevant:
                assert doc in own
            else:
                assert doc not in by_topic[r.topic]


def test_the_set_is_deterministic_per_seed():
    assert labelled_requests(50) == labelled_requests(50)
    assert labelled_requests(50) != labelled_requests(50, seed=1)
    assert labelled_requests(1000)[:50] == labelled_requests(50)  # "the first N"


def test_reciprocal_rank():
    scores = [0.1, 0.9, 0.5, 0.7]  # ranking: items 1, 3, 2, 0
    assert reciprocal_rank(scores, [2]) == pytest.approx(1 / 3)
    assert reciprocal_rank(scores, [0, 3]) == pytest.approx(1 / 2)  # the first relevant counts
    assert reciprocal_rank(scores, [1]) == 1.0
    assert reciprocal_rank(scores, []) == 0.0
    assert reciprocal_rank([0.5, 0.5, 0.2], [1]) == pytest.approx(1 / 2)  # ties: index order


def test_ndcg_at_10_with_binary_relevance():
    scores = [0.1, 0.9, 0.5, 0.7]  # relevant items 2 and 0 sit at ranks 3 and 4
    dcg = 1 / math.log2(4) + 1 / math.log2(5)  # 0.5 + 0.4307
    ideal = 1 / math.log2(2) + 1 / math.log2(3)  # 1 + 0.6309
    assert ndcg_at_10(scores, [2, 0]) == pytest.approx(dcg / ideal)
    assert ndcg_at_10(scores, [2, 0]) == pytest.approx(0.57064, abs=1e-5)
    assert ndcg_at_10(scores, [1, 3]) == pytest.approx(1.0)
    eleventh = [1.0 - k / 100 for k in range(12)]  # item k at rank k + 1
    assert ndcg_at_10(eleventh, [11]) == 0.0  # beyond the top 10
    assert ndcg_at_10(eleventh, [9]) == pytest.approx(1 / math.log2(11))


def test_the_chance_level_of_a_random_order():
    assert random_mrr(2, 1) == pytest.approx((1 + 1 / 2) / 2)
    assert random_mrr(10, 1) == pytest.approx(sum(1 / r for r in range(1, 11)) / 10)  # 0.2929
    # 3 items, 2 relevant: one is first with p 2/3, else the best is second
    assert random_mrr(3, 2) == pytest.approx(2 / 3 + 1 / 3 * 1 / 2)
    assert random_mrr(5, 5) == 1.0
    # 2 items, 1 relevant: rank 1 or 2, each half the time; the ideal DCG is 1
    assert random_ndcg_at_10(2, 1) == pytest.approx((1 + 1 / math.log2(3)) / 2)
    assert random_ndcg_at_10(4, 4) == pytest.approx(1.0)


def test_kendall_tau_b():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx((5 - 1) / 6)  # 1 swap of 6
    # a ties items 0 and 1: 2 concordant pairs, 1 tied in a only -> 2 / sqrt(3 * 2)
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8164966, abs=1e-6)
    assert kendall_tau([5, 5, 5], [5, 5, 5]) == 1.0
    assert kendall_tau([5, 5, 5], [1, 2, 3]) == 0.0


def test_top1_agreement():
    assert same_top1([0.2, 0.9, 0.1], [0.3, 0.8, 0.5])
    assert not same_top1([0.2, 0.9, 0.1], [0.9, 0.1, 0.2])


def test_compare_two_precisions_on_one_request():
    reference = [[[-1.5, -2.0], [-3.0, -1.0]]]  # items × (yes, no) log-probs
    other = [[[-1.0, -2.0], [-3.0, -1.0]]]  # one label of item 0 moved by 0.5
    got = compare(other, reference)
    assert got["logprob_abs_diff_max"] == 0.5 and got["logprob_abs_diff_p99"] == 0.5
    assert got["logprob_abs_diff_p50"] == 0.0  # 3 of the 4 log-probs are equal
    # P(yes)/(P(yes)+P(no)): item 0 0.73 vs 0.62, item 1 0.12 in both: the same order
    assert got["top1_agreement"] == 1.0 and got["kendall_tau_mean"] == 1.0
    flipped = [[[-3.0, -1.0], [-1.5, -2.0]]]
    assert compare(flipped, reference)["top1_agreement"] == 0.0
    assert compare(flipped, reference)["kendall_tau_mean"] == -1.0


def test_settings_parse_and_the_recommendation_needs_99_percent_of_a_useful_bf16():
    assert parse_setting("all") == Fp8Config()
    assert parse_setting("no_o+edges2") == Fp8Config(
        linears=("qkv_proj", "gate_up_proj", "down_proj"), bf16_first_layers=2,
        bf16_last_layers=2)
    with pytest.raises(ValueError, match="no_up"):
        parse_setting("no_up")

    def row(name, mrr, mrr_random=0.30):
        return {"setting": name, "fp8_linears": [] if name == "bf16" else ["qkv_proj"],
                "mrr": mrr, "mrr_bf16": 0.80, "mrr_random": mrr_random, "recommended": False}

    rows = recommend([row("bf16", 0.80), row("a", 0.70), row("b", 0.795), row("c", 0.79)])
    assert [r["setting"] for r in rows if r["recommended"]] == ["b"]  # 0.795 >= 0.99 * 0.80
    rows = recommend([row("bf16", 0.80), row("a", 0.70), row("c", 0.79)])
    assert not any(r["recommended"] for r in rows)  # 0.79 < 0.792
    rows = recommend([row("bf16", 0.80, 0.78), row("b", 0.80, 0.78)])
    assert not any(r["recommended"] for r in rows)  # bf16 at chance: MRR says nothing
