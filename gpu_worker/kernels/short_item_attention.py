"""Attention of short items (Triton, GPU only): full query tiles across the items of one query,
each row's sums in the same steps whatever shares its tile (docs/ARCHITECTURE.md, "Short items").

A program computes one tile of a sequence's short items (gpu_worker/attention/short_items.py
lays them out) for one K/V head: up to BLOCK_M query rows, the tile's tokens × the heads that
share the K/V head, cut from consecutive short item blocks of one sequence (an item may span two
tiles). Every row first reads its query's keys in blocks of BLOCK_N counted from the query's
first key (the cached query rows, then the sequence's own), so every item of a query advances
its sums in the same steps, in or out of the prefix cache. Then it reads each item of the tile
in turn, that item's keys as one block loaded from the item's first row: a row of another item
masks the whole block out, a step that leaves its running maximum, sum and output exactly as
they were (a factor of exactly 1, terms of exactly 0), so a row's result is what it would be in
a tile of its own. The row-wise reductions and the dot products are per row, the same code
whatever the row's place in the tile.

The tables (int32): `tiles` [n, 8] = first and end token row of the tile, first key row and
count of its query's cached rows, first key row and count of its own query rows, first item
and item count in `items`; `items` [m, 2] = first row and rows of each item. A tile whose end
row is its first (the padding of a CUDA graph's fixed table) reads and writes nothing.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpu_worker.attention.short_items import block_m

BLOCK_N = 64  # query keys a step reads


@triton.jit
def _step(high, total, acc, s, v):
    """One online-softmax step over a block of keys (`s` in log2 units, -inf where masked)."""
    new_high = tl.maximum(high, tl.max(s, 1))
    alpha = tl.exp2(high - new_high)
    p = tl.exp2(s - new_high[:, None])
    total = total * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return new_high, total, acc


@triton.jit
def _short_item_attention_kernel(
        q_ptr, k_ptr, v_ptr, out_ptr, tiles_ptr, items_ptr,
        q_stride_t, q_stride_h, k_stride_t, k_stride_h, v_stride_t, v_stride_h,
        o_stride_t, o_stride_h, qk_scale,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, ITEM_TOKENS: tl.constexpr):
    tile = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    meta = tiles_ptr + tile * 8
    first_row = tl.load(meta)
    end_row = tl.load(meta + 1)
    cached_at = tl.load(meta + 2)
    cached = tl.load(meta + 3)
    query_at = tl.load(meta + 4)
    n_query = cached + tl.load(meta + 5)
    first_item = tl.load(meta + 6)
    n_items = tl.load(meta + 7)

    r = tl.arange(0, BLOCK_M)
    token = first_row + r // GROUP
    head = kv_head * GROUP + r % GROUP
    row_ok = token < end_row
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + token.to(tl.int64)[:, None] * q_stride_t + head[:, None] * q_stride_h
                + d[None, :], mask=row_ok[:, None], other=0.0)
    # finite, so that a block a row does not see (all -inf) is a step of factor exactly 1
    high = tl.full([BLOCK_M], -1.0e30, tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    cols = tl.arange(0, BLOCK_N)
    for start in range(0, n_query, BLOCK_N):
        pos = start + cols
        key_ok = pos < n_query
        key_row = tl.where(pos < cached, cached_at + pos, query_at + pos - cached).to(tl.int64)
        k = tl.load(k_ptr + key_row[:, None] * k_stride_t + kv_head * k_stride_h + d[None, :],
                    mask=key_ok[:, None], other=0.0)
        v = tl.load(v_ptr + key_row[:, None] * v_stride_t + kv_head * v_stride_h + d[None, :],
                    mask=key_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(key_ok[None, :], s, float("-inf"))
        high, total, acc = _step(high, total, acc, s, v)

    own = tl.arange(0, ITEM_TOKENS)
    for j in range(n_items):
        item = items_ptr + (first_item + j) * 2
        item_row = tl.load(item)
        item_end = item_row + tl.load(item + 1)
        key_row = item_row + own
        key_ok = key_row < item_end
        k = tl.load(k_ptr + key_row.to(tl.int64)[:, None] * k_stride_t + kv_head * k_stride_h
                    + d[None, :], mask=key_ok[:, None], other=0.0)
        v = tl.load(v_ptr + key_row.to(tl.int64)[:, None] * v_stride_t + kv_head * v_stride_h
                    + d[None, :], mask=key_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        # a row of this item sees its keys up to itself; any other row sees none of them
        sees = key_ok[None, :] & (key_row[None, :] <= token[:, None]) & (
            token[:, None] < item_end)
        s = tl.where(sees, s, float("-inf"))
        high, total, acc = _step(high, total, acc, s, v)

    out = acc / total[:, None]
    tl.store(out_ptr + token.to(tl.int64)[:, None] * o_stride_t + head[:, None] * o_stride_h
             + d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def short_item_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                         tiles: torch.Tensor, items: torch.Tensor, item_tokens: int) -> None:
    """Write the short items' rows of `out` [T, Hq, D] from q [T, Hq, D] and the key rows of
    k / v [K, Hkv, D] (the batch's own rows, then any cached ones), as `tiles` [n, 8] and
    `items` [m, 2] (int32, the module docstring) lay them out; the other rows are left as they
    are. `item_tokens`: the longest short item, a power of two."""
    heads, kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
    if not tiles.shape[0]:
        return
    assert q.stride(2) == k.stride(2) == v.stride(2) == out.stride(2) == 1
    _short_item_attention_kernel[(tiles.shape[0], kv_heads)](
        q, k, v, out, tiles, items,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), head_dim ** -0.5 * math.log2(math.e),
        GROUP=heads // kv_heads, HEAD_DIM=head_dim, BLOCK_M=block_m(head_dim), BLOCK_N=BLOCK_N,
        ITEM_TOKENS=item_tokens, num_warps=8)


def short_item_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   tiles: torch.Tensor, items: torch.Tensor
                                   ) -> dict[int, torch.Tensor]:
    """The kernel's reference in float64: {token row: [Hq, D]} for every row of every item of
    the tables, each row over its query's keys and its own item's keys up to itself."""
    group = q.shape[1] // k.shape[1]
    rows = {}
    for first, end, cached_at, cached, query_at, n_query, first_item, n_items in tiles.tolist():
        keys = list(range(cached_at, cached_at + cached)) + list(range(query_at,
                                                                       query_at + n_query))
        for item_row, n in items[first_item:first_item + n_items].tolist():
            for row in range(max(first, item_row), min(end, item_row + n)):
                sees = torch.tensor(keys + list(range(item_row, row + 1)), device=q.device)
                kk = k[sees].double().repeat_interleave(group, dim=1)  # [S, Hq, D]
                vv = v[sees].double().repeat_interleave(group, dim=1)
                weights = torch.einsum("hd,shd->hs", q[row].double(), kk) * q.shape[2] ** -0.5
                rows[row] = torch.einsum("hs,shd->hd", weights.softmax(-1), vv)
    return rows
