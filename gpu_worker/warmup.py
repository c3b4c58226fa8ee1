"""Start-up warm-up: every kernel variant a batch can need is built before the replica reports
ready, so nothing compiles on the request path (docs/ARCHITECTURE.md, "Warm-up").

Triton compiles a kernel on its first call and again for each new specialization of its
arguments (each integer and pointer argument is specialized on being 16-divisible). So:
- the fused gate/up kernel runs only from FUSED_GATE_UP_MIN_TOKENS rows: the budget-sized
  batches here reach it (the memory probe's batch is smaller);
- the positions a batch passes are a view into one metadata tensor after its T token ids
  (gpu_worker/host_tensors.py), 16-aligned for an even T only: both parities run;
- FlashInfer builds its modules on the first plan() of multi-item and of plain (empty-query)
  layouts, and the longest sequence sets the largest positions and attention rows.
- with a prefix cache, a batch that reads it runs FlashInfer's non-causal pass over the pool
  and the merge of two passes' outputs: more modules built on first use (cached_warm_up_batches).
Graph buckets are captured at start-up already; the batches here run eagerly, as under load,
which also grows the memory pools to their working size.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator

from ranker_contract.packing import (
    PackedSequence,
    cacheable_query,
    multi_item_length,
    pack_multi_item,
    pack_plain,
)

QUERY_TOKENS, ITEM_TOKENS = 120, 180  # the bench shape; other shapes differ only in sizes


def warm_up_batches(budget_tokens: int, max_seq_tokens: int) -> list[list[PackedSequence]]:
    """Batches that together run every kernel variant: multi-item and plain, even and odd token
    totals, at the budget and small, and one sequence of max_seq_tokens (the longest positions
    and attention rows)."""
    batches = []
    for total in (budget_tokens, budget_tokens - 1, 700, 701):
        if 0 < total <= budget_tokens:
            batches.append(list(_multi_item_batch(total, max_seq_tokens)))
    batches.append([pack_plain([7] * n, 0) for n in (300, 301)])  # an empty query's layout
    batches.append([pack_plain([7] * max_seq_tokens, 0)])
    batches.append(list(_multi_item_batch(max_seq_tokens, max_seq_tokens)))
    return batches


def cached_warm_up_batches(budget_tokens: int, max_seq_tokens: int, min_tokens: int,
                           min_share: float) -> list[list[PackedSequence]]:
    """A sequence whose query the prefix cache keeps (long enough, and a large enough share of
    the sequence), then a batch of the budget's worth of sequences with that query, which read
    it. Empty when no sequence of max_seq_tokens holds such a query and one item."""
    if min_share >= 1:  # no multi-item query is all of its sequence
        return []
    for items in (8, 1):
        after_query = multi_item_length(0, [ITEM_TOKENS] * items)  # items and delimiters
        query_len = max(min_tokens, math.ceil(min_share * after_query / (1 - min_share)))
        seq = pack_multi_item([5] * query_len, [[6] * ITEM_TOKENS] * items, 0)
        while not cacheable_query(seq, min_tokens, min_share):  # rounding: one more token
            query_len += 1
            seq = pack_multi_item([5] * query_len, [[6] * ITEM_TOKENS] * items, 0)
        if seq.num_tokens <= max_seq_tokens:
            return [[seq], [seq] * max(1, budget_tokens // seq.num_tokens)]
    return []


def _multi_item_batch(total: int, max_seq_tokens: int) -> Iterator[PackedSequence]:
    """Multi-item sequences of the bench shape, then one plain sequence to make `total` tokens."""
    one = QUERY_TOKENS + 2 * (ITEM_TOKENS + 1)  # ranker_contract/packing.py::multi_item_length
    left = total
    while left - one > 0:
        items = min((left - QUERY_TOKENS - 1) // (ITEM_TOKENS + 1),
                    (max_seq_tokens - QUERY_TOKENS - 1) // (ITEM_TOKENS + 1))
        seq = pack_multi_item([5] * QUERY_TOKENS, [[6] * ITEM_TOKENS] * items, 0)
        yield seq
        left -= seq.num_tokens
    if left:
        yield pack_plain([7] * left, 0)


def triton_variants() -> int:
    """Triton kernels compiled in this process so far, over every specialization of this
    package's kernels (Triton keeps one cache entry per variant)."""
    count = 0
    for name in ("add_norm_kernel", "fp8_quant_kernel", "gate_up_silu_kernel", "qkv_kernel"):
        module = sys.modules.get(f"gpu_worker.{name}")
        for value in vars(module).values() if module else ():
            for cache in getattr(value, "device_caches", {}).values():
                count += len(cache[0])
    return count
