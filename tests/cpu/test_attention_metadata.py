"""What each row may attend to, as both attention backends build it from the packing metadata:
the FlashInfer request layout (gpu_worker/attention/flashinfer.py::paged_layout, built on the
host and checked here without a GPU) and the torch backend's mask."""

import random

import pytest
import torch

from gpu_worker.attention.flashinfer import (
    add_tile_request,
    hide_tile_request,
    paged_layout,
    zero_int_workspace,
)
from gpu_worker.attention.sdpa import multi_item_mask
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


def visible_by_tables(tiles, items):
    """Row -> the rows it attends to, as the short-item kernel reads them
    (gpu_worker/kernels/short_item_attention.py): its query's keys (cached, then its own query
    rows), then its item's up to itself; each row in exactly one tile."""
    seen = {}
    for t in range(0, len(tiles), 8):
        first, end, cached_at, cached, query_at, n_query, first_item, n_items = tiles[t:t + 8]
        query = set(range(cached_at, cached_at + cached)) | set(range(query_at,
                                                                      query_at + n_query))
        covered = set()
        for i in range(first_item, first_item + n_items):
            item_row, n = items[2 * i], items[2 * i + 1]
            assert item_row < end and item_row + n > first  # the item overlaps the tile
            for row in range(max(first, item_row), min(end, item_row + n)):
                assert row not in seen
                seen[row] = query | set(range(item_row, row + 1))
                covered.add(row)
        assert covered == set(range(first, end))  # the tile's rows are its items'
    return seen


@pytest.mark.parametrize("short", [0, 1, 3, 32])
def test_short_item_blocks_are_the_kernels_and_every_row_still_sees_what_the_mask_says(short):
    """With short item blocks taken out (gpu_worker/attention/short_items.py), the short-item
    tables give each of their rows what the mask gives it, FlashInfer's layout gives every
    other row the same as before, and still covers every row once (a run of short blocks is one
    request over its own rows, whose output the kernel overwrites)."""
    from gpu_worker.attention.short_items import short_item_tables, short_runs

    rng = random.Random(short)
    for _ in range(200):
        sequences = random_sequences(rng)
        total = sum(s.num_tokens for s in sequences)
        tile = rng.choice([1, 2, 3, 64])
        by_tables = visible_by_tables(*short_item_tables(sequences, [None] * len(sequences),
                                                         short, tile))
        by_layout = visible_by_layout(*paged_layout(sequences, short=short), total)
        whole = visible_by_layout(*paged_layout(sequences), total)
        offset, short_rows = 0, set()
        for seq in sequences:
            starts = [0, *seq.block_ends[:-1]]
            for b, (start, end) in enumerate(zip(starts, seq.block_ends)):
                if b and end - start <= short:
                    short_rows |= set(range(offset + start, offset + end))
            assert {(offset + a, offset + b) for run in short_runs(seq, short)
                    for a, b in run} == {(offset + a, offset + b) for b_, (a, b) in
                                         enumerate(zip(starts, seq.block_ends))
                                         if b_ and b - a <= short}
            offset += seq.num_tokens
        assert set(by_tables) == short_rows
        for row in range(total):
            assert (by_tables if row in short_rows else by_layout)[row] == whole[row], row


def test_short_item_tables_of_cached_query_rows_name_the_cached_rows_first():
    from gpu_worker.attention.prefix_cache import cached_form
    from gpu_worker.attention.short_items import short_item_tables

    # query of 6 rows, 4 of them cached; items of 2, 1 and 5 tokens (+ delimiter)
    seq = cached_form(pack_multi_item([1] * 6, [[2] * 2, [3], [4] * 5], D), 4)
    tiles, items = short_item_tables([pack_plain([9] * 3, 0), seq],
                                     [None, range(100, 104)], 4, 64)
    # rows: plain 0-2; the sequence from 3: query 3-4, D 5, items 6-8, 9-10, 11-16
    assert list(tiles) == [6, 11, 100, 4, 3, 2, 0, 2]  # the 6-row item is not short
    assert list(items) == [6, 3, 9, 2]


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


def test_a_sequence_with_cached_query_rows_has_the_page_lists_of_the_whole_sequence():
    """A sequence whose first C query rows come from the prefix cache
    (gpu_worker/attention/prefix_cache.py: all of the query, or its first pages) runs without them;
    its cached rows are gathered from the pool after the batch's rows, once per query
    (cached_gather). Every request of it, its keys named by the row of the whole sequence they are,
    lists the same keys in the same order as the whole sequence's request for the same block: a hit
    is the kernel work of a miss."""
    from gpu_worker.attention.flashinfer import cached_gather
    from gpu_worker.attention.prefix_cache import cached_form

    def requests(layout, names):
        """Per request: (query rows, its keys by name)."""
        qo_indptr, kv_indptr, kv_indices = layout
        return [(qo_indptr[r + 1] - qo_indptr[r],
                 [names[i] for i in kv_indices[kv_indptr[r]:kv_indptr[r + 1]]])
                for r in range(len(qo_indptr) - 1)]

    rng = random.Random(1)
    for _ in range(200):
        wholes = [pack_multi_item([1] * rng.randint(1, 9),
                                  [[2] * rng.randint(1, 5) for _ in range(rng.randint(1, 4))],
                                  D) for _ in range(2)]
        cuts = [rng.randint(1, w.prefix_len) for w in wholes]  # a prefix, or all of the query
        parts = [cached_form(w, c) for w, c in zip(wholes, cuts)]
        pool = rng.sample(range(100), sum(cuts))  # the cached rows' slots, in query order
        slots = [pool[:cuts[0]], pool[cuts[0]:]]
        plain = pack_plain([1] * rng.randint(1, 4), 0)
        # the first query twice (a request over two sequences): its cached rows gathered once
        batch = [parts[0], plain, parts[1], parts[0]]
        batch_slots = [slots[0], None, slots[1], slots[0]]
        whole_batch = [wholes[0], plain, wholes[1], wholes[0]]
        names = ("a", "p", "b", "a")

        whole_names = [(n, r) for n, s in zip(names, whole_batch) for r in range(s.num_tokens)]
        want = requests(paged_layout(whole_batch), whole_names)

        rows = sum(s.num_tokens for s in batch)
        gather, cached_rows = cached_gather(rows, batch_slots)
        assert list(gather) == pool
        assert cached_rows == [range(rows, rows + cuts[0]), None,
                               range(rows + cuts[0], rows + len(pool)),
                               range(rows, rows + cuts[0])]
        part_names = [(n, r + (cuts[0] if n == "a" else cuts[1] if n == "b" else 0))
                      for n, s in zip(names, batch) for r in range(s.num_tokens)]
        part_names += [("a", r) for r in range(cuts[0])] + [("b", r) for r in range(cuts[1])]
        got = requests(paged_layout(batch, cached_rows), part_names)
        assert [keys for _, keys in got] == [keys for _, keys in want]
        # each query block's request runs without its cut rows; every other request as whole
        heads = [0]
        for s in whole_batch[:-1]:
            heads.append(heads[-1] + len(s.block_ends))
        cut_of = {heads[0]: cuts[0], heads[2]: cuts[1], heads[3]: cuts[0]}
        assert [n + cut_of.get(r, 0) for r, (n, _) in enumerate(got)] == [n for n, _ in want]


def test_the_graph_workaround_zeroes_both_int_buffers_and_names_a_missing_one():
    """gpu_worker/attention/flashinfer.py::zero_int_workspace on stand-ins for the wrapper: both
    private buffers zeroed; a FlashInfer whose wrapper lacks one fails naming it."""
    class Wrapper:
        def __init__(self):
            self._pin_memory_int_workspace_buffer = torch.full((8,), 7, dtype=torch.uint8)
            self._int_workspace_buffer = torch.full((8,), 9, dtype=torch.uint8)

    wrapper = Wrapper()
    zero_int_workspace(wrapper)
    assert not wrapper._pin_memory_int_workspace_buffer.any()
    assert not wrapper._int_workspace_buffer.any()
    del wrapper._int_workspace_buffer
    with pytest.raises(RuntimeError, match="_int_workspace_buffer"):
        zero_int_workspace(wrapper)


def eager_tile(qo_indptr, group, head_dim=128):
    """The query tile FlashInfer 0.6.6's eager planner picks (scheduler.cuh: the average packed
    block, in integer division, then FA2DetermineCtaTileQ on an Ampere-or-newer GPU)."""
    average = (qo_indptr[-1] - qo_indptr[0]) * group // (len(qo_indptr) - 1)
    if average > 64 and head_dim < 256:
        return 128
    return 64 if average > 16 else 16


@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_a_request_added_where_needed_makes_every_eager_plan_take_the_widest_tile(group):
    """gpu_worker/attention/flashinfer.py::add_tile_request: short blocks (one-token items, a
    cache hit's delimiter-only query block) and long ones, each planned at 128 rows; the
    request is added only where needed, with no K/V, and is as short as it can be."""
    rng = random.Random(group)
    for _ in range(300):
        lengths = [rng.choice([1, 2, rng.randint(1, 40), rng.randint(1, 400)])
                   for _ in range(rng.randint(1, 300))]
        qo_indptr = [0]
        for n in lengths:
            qo_indptr.append(qo_indptr[-1] + n)
        kv_indptr = list(range(len(qo_indptr)))  # any page lists
        before = (list(qo_indptr), list(kv_indptr))
        extra = add_tile_request(qo_indptr, kv_indptr, group, head_dim=128)
        assert eager_tile(qo_indptr, group) == 128
        if eager_tile(before[0], group) == 128:
            assert extra == 0 and (qo_indptr, kv_indptr) == before
            continue
        assert qo_indptr[:-1] == before[0] and qo_indptr[-1] == before[0][-1] + extra
        assert kv_indptr == before[1] + [before[1][-1]]  # no K/V
        one_less = before[0] + [before[0][-1] + extra - 1]
        assert eager_tile(one_less, group) < 128


def test_with_head_dim_256_the_widest_tile_is_the_64_row_one_planned_above_16_rows():
    qo_indptr, kv_indptr = [0, 3, 6], [0, 1, 2]
    assert add_tile_request(qo_indptr, kv_indptr, group=2, head_dim=256) == 20
    assert qo_indptr == [0, 3, 6, 26] and eager_tile(qo_indptr, 2, head_dim=256) == 64
    assert eager_tile([0, 3, 6, 25], 2, head_dim=256) == 16


def test_the_added_request_ends_at_the_batch_on_the_device():
    """hide_tile_request on a stand-in wrapper: the device row offsets' last entry (the added
    request's end) set back to the batch's rows, the others untouched."""
    class Wrapper:
        _qo_indptr_buf = torch.tensor([0, 4, 9, 40], dtype=torch.int32)

    wrapper = Wrapper()
    hide_tile_request(wrapper, 9)
    assert wrapper._qo_indptr_buf.tolist() == [0, 4, 9, 9]


def test_an_engine_on_a_flashinfer_without_the_private_field_fails_at_start_naming_it(
        monkeypatch):
    """FlashInferAttention (deterministic) checks the field hide_tile_request writes when it is
    built, so an engine fails at start, not on its first short-item batch."""
    import sys
    import types

    from gpu_worker.attention.flashinfer import FlashInferAttention

    class Wrapper:  # FlashInfer's wrapper as a release without the field would build it
        def __init__(self, *args, **kwargs):
            pass

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(
        BatchPrefillWithPagedKVCacheWrapper=Wrapper))
    cfg = types.SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    cpu = torch.device("cpu")
    FlashInferAttention(cfg, cpu, split_kv=True)  # not deterministic: nothing written
    with pytest.raises(RuntimeError, match="_qo_indptr_buf.*deterministic: false"):
        FlashInferAttention(cfg, cpu, split_kv=False)
    Wrapper._qo_indptr_buf = None  # the release's wrapper before its first plan()
    FlashInferAttention(cfg, cpu, split_kv=False)


def test_a_batch_attention_refuses_to_run_once_its_wrapper_planned_another(monkeypatch):
    """A FlashInfer wrapper holds one plan at a time: a batch's attention (what plan() returns,
    gpu_worker/attention/flashinfer.py::FlashInferBatchAttention) runs on its own plan only, and
    is refused, never run on another batch's layout, once the backend planned the next batch."""
    import sys
    import types

    from gpu_worker.attention import flashinfer as backend

    runs = []

    class Wrapper:  # records which plan each run() read
        def __init__(self, *args, **kwargs):
            self.planned = None

        def run(self, q, kv, out, return_lse=False):
            runs.append(self.planned)
            return out

    def plan_wrapper(wrapper, cfg, device, qo_indptr, *args, **kwargs):
        wrapper.planned = tuple(qo_indptr)
        return ()

    class NoFence:  # the real one records a CUDA event
        def wait(self):
            pass

        def issued(self):
            pass

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(
        BatchPrefillWithPagedKVCacheWrapper=Wrapper))
    monkeypatch.setattr(backend, "plan_wrapper", plan_wrapper)
    monkeypatch.setattr(backend, "_PlanFence", NoFence)
    # every block to FlashInfer: the short-item kernel's tables live on a GPU
    monkeypatch.setattr(backend, "short_item_tokens", lambda cfg: 0)
    cfg = types.SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    attention = backend.FlashInferAttention(cfg, torch.device("cpu"), split_kv=True)
    first_batch = [pack_multi_item([1, 2, 3], [[4], [5, 6]], 0)]
    second_batch = [pack_plain([7, 8], 0)]
    first = attention.plan(first_batch, torch.float32)
    q, k = torch.zeros(first_batch[0].num_tokens, 4, 16), torch.zeros(
        first_batch[0].num_tokens, 2, 16)
    first(q, k, k, 0)
    second = attention.plan(second_batch, torch.float32)
    with pytest.raises(RuntimeError, match="replaced by a later batch"):
        first(q, k, k, 1)
    second(q[:2], k[:2], k[:2], 0)
    assert runs == [tuple(paged_layout(first_batch)[0]), tuple(paged_layout(second_batch)[0])]
