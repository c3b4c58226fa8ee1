"""Packing layouts checked by hand against the contract in ranker_contract/packing.py (D =
delimiter id 0)."""

import pytest

from ranker_contract.packing import (
    PackingError,
    merge_results,
    multi_item_length,
    pack_multi_item,
    pack_plain,
    pack_request,
)

D = 0


def test_many_items():
    # query q1 q2 q3, items [a1 a2], [b1], [c1 c2 c3]
    seq = pack_multi_item([11, 12, 13], [[21, 22], [31], [41, 42, 43]], D)
    assert seq.input_ids == [11, 12, 13, D, 21, 22, D, 31, D, 41, 42, 43, D]
    assert seq.positions == [0, 1, 2, 2, 3, 4, 2, 3, 2, 3, 4, 5, 2]
    assert seq.prefix_len == 3
    assert seq.block_ends == [4, 7, 9, 13]  # [q1 q2 q3 D] [a1 a2 D] [b1 D] [c1 c2 c3 D]
    assert seq.score_rows == [5, 7, 11]
    assert seq.num_tokens == multi_item_length(3, [2, 1, 3]) == 13


def test_one_item():
    seq = pack_multi_item([5, 6], [[7, 8, 9]], D)
    assert seq.input_ids == [5, 6, D, 7, 8, 9, D]
    assert seq.positions == [0, 1, 1, 2, 3, 4, 1]
    assert seq.block_ends == [3, 7]
    assert seq.score_rows == [5]


def test_empty_item_scores_at_last_query_token():
    seq = pack_multi_item([5, 6], [[7], [], [8]], D)
    assert seq.input_ids == [5, 6, D, 7, D, D, 8, D]
    assert seq.block_ends == [3, 5, 6, 8]  # the empty item's block is its closing D alone
    assert seq.score_rows == [3, 1, 6]  # the empty item reads row 1 (last query token)


def test_empty_query():
    seq = pack_multi_item([], [[7, 8], [9]], D)
    assert seq.input_ids == [D, 7, 8, D, 9, D]
    assert seq.positions == [0, 0, 1, 0, 0, 0]  # item tokens start at position 0
    assert seq.prefix_len == 0
    assert seq.block_ends == [1, 4, 6]
    assert seq.score_rows == [2, 4]


def test_empty_query_and_empty_item_is_rejected():
    with pytest.raises(PackingError) as err:
        pack_multi_item([], [[7], []], D, item_offset=4)
    assert err.value.item_index == 5


def test_plain_sequence():
    seq = pack_plain([1, 2, 3], item_index=2)
    assert seq.prefix_len == 3 and seq.block_ends == [3] and seq.score_rows == [2]
    assert seq.positions == [0, 1, 2] and seq.item_offset == 2


def test_item_first_gives_one_plain_sequence_per_item():
    seqs = pack_request([1, 2], [[3], [4, 5]], item_first=True, delimiter_id=D,
                        max_seq_tokens=100, max_context=100)
    assert [s.input_ids for s in seqs] == [[3, 1, 2], [4, 5, 1, 2]]
    assert [s.score_rows for s in seqs] == [[2], [3]]
    assert [s.item_offset for s in seqs] == [0, 1]


def test_empty_query_gives_one_plain_sequence_per_item():
    # No shared prefix: no delimiters and no multi-item mask, each item attends to itself only.
    seqs = pack_request([], [[3], [4, 5]], item_first=False, delimiter_id=D,
                        max_seq_tokens=100, max_context=100)
    assert [s.input_ids for s in seqs] == [[3], [4, 5]]
    assert [s.positions for s in seqs] == [[0], [0, 1]]
    assert [s.prefix_len for s in seqs] == [1, 2] and [s.score_rows for s in seqs] == [[0], [1]]
    assert [s.item_offset for s in seqs] == [0, 1]
    with pytest.raises(PackingError) as err:
        pack_request([], [[3], []], item_first=False, delimiter_id=D, max_seq_tokens=100,
                     max_context=100)
    assert err.value.item_index == 1


def test_split_at_item_boundaries_keeps_order():
    query, items = [1, 2], [[3, 3], [4], [5, 5, 5], [6]]
    # 2 (query) + 1 (final D) + (len + 1) per item: budget 8 fits [3,3]+[4] (3+3+2 = 8);
    # [5,5,5] takes 7, and [6] would make it 9.
    seqs = pack_request(query, items, item_first=False, delimiter_id=D, max_seq_tokens=8,
                        max_context=100)
    assert [s.input_ids for s in seqs] == [
        [1, 2, D, 3, 3, D, 4, D],
        [1, 2, D, 5, 5, 5, D],
        [1, 2, D, 6, D],
    ]
    assert [s.item_offset for s in seqs] == [0, 2, 3]
    merged = merge_results(seqs, [[["a"], ["b"]], [["c"]], [["d"]]], 4)
    assert merged == [["a"], ["b"], ["c"], ["d"]]


def test_item_too_big_for_a_multi_item_sequence_falls_back_to_plain():
    seqs = pack_request([1, 2], [[3, 4, 5, 6]], item_first=False, delimiter_id=D,
                        max_seq_tokens=7, max_context=100)
    assert seqs[0].input_ids == [1, 2, 3, 4, 5, 6] and seqs[0].score_rows == [5]


def test_item_too_long_is_an_error_naming_it():
    with pytest.raises(PackingError) as err:
        pack_request([1], [[2], [3] * 10], item_first=False, delimiter_id=D,
                     max_seq_tokens=5, max_context=100)
    assert err.value.item_index == 1
    with pytest.raises(PackingError) as err:
        pack_request([1], [[2] * 10], item_first=False, delimiter_id=D,
                     max_seq_tokens=100, max_context=8)
    assert err.value.item_index == 0 and "context" in str(err.value)
