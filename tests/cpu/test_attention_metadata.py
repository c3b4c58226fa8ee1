"""What each row may attend to, as both attention backends build it from the packing metadata:
the FlashInfer request layout (gpu_worker/attention_flashinfer.py::paged_layout, built on the
host and checked here without a GPU) and the torch backend's mask."""

import random

from gpu_worker.attention_flashinfer import cached_layout, paged_layout
from gpu_worker.attention_torch import multi_item_mask
from ranker_contract.packing import pack_multi_item, pack_plain

D = 0


def test_layout_of_a_multi_item_sequence_and_a_plain_one_written_out():
    # rows 0-2 query, 3 D, 4-5 item a, 6 D, 7 item b, 8 D; then a plain sequence at rows 9-10
    sequences = [pack_multi_item([11, 12, 13], [[21, 22], [31]], D), pack_plain([1, 2], 0)]
    qo_indptr, kv_indptr, kv_indices = paged_layout(sequences)
    assert qo_indptr == [0, 4, 7, 9, 11]  # [Q D] [a D] [b D] [plain]
    assert kv_indptr == [0, 4, 10, 15, 17]
    assert list(kv_indices) == [0, 1, 2, 3,  # Q D: causal over itself
                                0, 1, 2, 4, 5, 6,  # a D: the query, then itself
                                0, 1, 2, 7, 8,  # b D
                                9, 10]  # plain: itself


def visible_by_layout(qo_indptr, kv_indptr, kv_indices, total):
    """Row -> the rows it attends to: a request's row j sees its K/V list up to the entry aligned
    with it from the end (the kernel's causal mask when there are more keys than queries)."""
    seen = {}
    for r in range(len(qo_indptr) - 1):
        qo_len = qo_indptr[r + 1] - qo_indptr[r]
        keys = list(kv_indices[kv_indptr[r]:kv_indptr[r + 1]])
        for j in range(qo_len):
            seen[qo_indptr[r] + j] = set(keys[: len(keys) - qo_len + j + 1])
    assert sorted(seen) == list(range(total))  # every row belongs to exactly one request
    return seen


def random_sequences(rng):
    sequences = []
    for _ in range(rng.randint(1, 4)):
        query = [1] * rng.randint(1, 6)
        if rng.random() < 0.3:
            sequences.append(pack_plain(query, 0))
        else:
            items = [[2] * rng.randint(0, 5) for _ in range(rng.randint(1, 5))]
            sequences.append(pack_multi_item(query, items, D))
    return sequences


def test_every_item_row_sees_the_query_and_its_own_item_so_far_in_both_backends():
    rng = random.Random(0)
    for _ in range(200):
        sequences = random_sequences(rng)
        total = sum(s.num_tokens for s in sequences)
        by_layout = visible_by_layout(*paged_layout(sequences), total)
        offset = 0
        for seq in sequences:
            mask = multi_item_mask(seq)
            for row in range(seq.num_tokens):
                from_mask = {offset + c for c in range(seq.num_tokens) if mask[row, c]}
                assert by_layout[offset + row] == from_mask, (seq, row)
            # The contract itself: item k's rows see the query and I_k up to themselves.
            ends = seq.block_ends
            for block in range(1, len(ends)):
                item_rows = range(ends[block - 1], ends[block] - 1)  # without the closing D
                for row in item_rows:
                    expected = set(range(seq.prefix_len)) | set(range(item_rows.start, row + 1))
                    assert by_layout[offset + row] == {offset + r for r in expected}
            if len(ends) == 1:  # plain: causal
                for row in range(seq.num_tokens):
                    assert by_layout[offset + row] == set(range(offset, offset + row + 1))
            offset += seq.num_tokens


def test_layout_of_a_batch_past_the_first_row_table_counts_every_row():
    # 70,000 rows: more than the 65,536 indices the page lists are first sliced from.
    sequences = [pack_plain([1] * 30_000, 0), pack_multi_item([1] * 5, [[2] * 20_000] * 2, D)]
    qo_indptr, kv_indptr, kv_indices = paged_layout(sequences)
    assert qo_indptr == [0, 30_000, 30_006, 50_007, 70_008]
    plain, head, item_a, item_b = (list(kv_indices[kv_indptr[r]:kv_indptr[r + 1]])
                                   for r in range(4))
    assert plain == list(range(30_000))
    assert head == list(range(30_000, 30_006))
    assert item_a == list(range(30_000, 30_005)) + list(range(30_006, 50_007))
    assert item_b == list(range(30_000, 30_005)) + list(range(50_007, 70_008))


def test_rows_with_a_cached_query_prefix_see_what_they_see_in_the_whole_sequence():
    """A sequence whose first C query rows come from the prefix cache (gpu_worker/prefix_cache.py:
    all of the query, or its first pages) runs without them, first in its batch; its rows see
    their own rows through the causal layout and the C pool slots through the non-causal pass
    over the pool (cached_layout). Together each row must see exactly what the same row sees
    in the whole sequence, in both backends."""
    from gpu_worker.attention_torch import cached_query_mask
    from gpu_worker.prefix_cache import cached_form

    rng = random.Random(1)
    for _ in range(200):
        plain = pack_plain([1] * rng.randint(1, 4), 0)
        whole = pack_multi_item([1] * rng.randint(1, 9),
                                [[2] * rng.randint(1, 5) for _ in range(rng.randint(1, 4))], D)
        cut = rng.randint(1, whole.prefix_len)  # cached query rows: a prefix, or all of them
        part = cached_form(whole, cut)
        slots = rng.sample(range(100), cut)  # the pool slots of the cached rows, in query order
        batch = [part, plain]
        by_layout = visible_by_layout(*paged_layout(batch), part.num_tokens + plain.num_tokens)
        qo_indptr, kv_indptr, kv_indices = cached_layout(batch, [slots, None])
        assert qo_indptr == [0, part.num_tokens]  # one request: every row of `part`, not `plain`
        assert list(kv_indices[kv_indptr[0]:kv_indptr[1]]) == slots  # seen whole (non-causal)
        whole_mask = multi_item_mask(whole)
        part_mask = cached_query_mask(part, cut)  # columns: the cached rows, then part's rows
        for r in range(part.num_tokens):
            row = r + cut  # the same row in the whole sequence
            if row + 1 in whole.block_ends[1:]:
                continue  # an item's closing delimiter: nothing reads it
            assert all(whole_mask[row, c] for c in range(cut))  # every row sees all C
            own = {c - cut for c in range(cut, whole.num_tokens) if whole_mask[row, c]}
            assert by_layout[r] == own
            assert all(part_mask[r, c] for c in range(cut))
            assert {c - cut for c in range(cut, part_mask.shape[1]) if part_mask[r, c]} == own
