"""`torch` attention backend: SDPA per attention block, from the packing metadata.

Used on CPU, in CI, and as the reference for the GPU backend. The multi-item rule
(docs/ARCHITECTURE.md, "The packing contract") is built from prefix_len and block_ends only, never
from token values: block 0 is causal; a row of a later block sees the query rows
[0, prefix_len) and the rows of its own block up to itself. As on the GPU, each block is its own
SDPA call over exactly those keys, so an item's attention is the same computation whatever else
its sequence holds (docs/ARCHITECTURE.md, "Deterministic scores"), and no masked-out key costs
anything.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ranker_contract.packing import PackedSequence


def multi_item_mask(seq: PackedSequence) -> torch.Tensor:
    """[L, L] bool, True = attend. Every row sees at least itself (SDPA gives NaN otherwise)."""
    n = seq.num_tokens
    rows = torch.arange(n)[:, None]  # [L, 1]
    cols = torch.arange(n)[None, :]  # [1, L]
    block = torch.bucketize(torch.arange(n), torch.tensor(seq.block_ends), right=True)  # [L]
    same_block = block[:, None] == block[None, :]
    sees_query = (block[:, None] > 0) & (cols < seq.prefix_len)
    return (cols <= rows) & (same_block | sees_query)


def block_mask(prefix: int, rows: int) -> torch.Tensor:
    """[rows, prefix + rows] bool: every row sees the `prefix` keys, then its block up to
    itself."""
    own = torch.ones(rows, rows, dtype=torch.bool).tril()
    return torch.cat([torch.ones(rows, prefix, dtype=torch.bool), own], dim=1)


class TorchAttention:
    """Plans a batch's SDPA calls and their masks (TorchBatchAttention). `pool`: the prefix
    cache's K/V, [layers, slots, 2, Hkv, D], or None."""

    def __init__(self, device: torch.device, pool: torch.Tensor | None = None) -> None:
        self.device = device
        self.pool = pool

    def plan(self, sequences: list[PackedSequence], dtype: torch.dtype,
             cached_slots: list[Sequence[int] | None] | None = None) -> TorchBatchAttention:
        calls, start = [], 0
        masks: dict[tuple[int, int], torch.Tensor] = {}  # by (prefix, rows)
        for seq, slots in zip(sequences, cached_slots or [None] * len(sequences), strict=True):
            # A sequence reading the prefix cache sees its cached query rows first, then the
            # query rows left: the keys, in the order, of the same block of the whole sequence.
            pool_slots, cached = None, 0
            if slots is not None:
                pool_slots = torch.tensor(slots, dtype=torch.int64, device=self.device)
                cached = len(slots)
            block_start = 0
            for block, block_end in enumerate(seq.block_ends):
                rows, query = block_end - block_start, seq.prefix_len if block else 0
                prefix, mask = cached + query, None
                if prefix:
                    if (prefix, rows) not in masks:
                        masks[prefix, rows] = block_mask(prefix, rows).to(self.device)
                    mask = masks[prefix, rows]
                calls.append((range(start + block_start, start + block_end),
                              range(start, start + query), mask, pool_slots))
                block_start = block_end
            start += seq.num_tokens
        return TorchBatchAttention(calls, self.pool)


class TorchBatchAttention:
    """One batch's attention, called once per layer: one SDPA call each of `calls`, (its rows
    [start, end), the query rows it also sees (an empty range for none), its mask (None:
    causal), the pool slots of the cached query rows it sees first (None: none))."""

    def __init__(self, calls: list[tuple[range, range, torch.Tensor | None,
                                         torch.Tensor | None]],
                 pool: torch.Tensor | None) -> None:
        self.calls = calls
        self.pool = pool

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 layer: int) -> torch.Tensor:
        out = torch.empty_like(q)
        gathered: dict[int, torch.Tensor] = {}  # a sequence's cached rows, once for its blocks
        for rows, query, mask, slots in self.calls:
            # SDPA wants [batch, heads, L, D]
            qs, ks, vs = (x[rows.start:rows.stop].transpose(0, 1).unsqueeze(0)
                          for x in (q, k, v))
            if query:  # the query rows come first, then the block's own
                ks, vs = (torch.cat([x[query.start:query.stop].transpose(0, 1).unsqueeze(0),
                                     own], dim=2) for x, own in ((k, ks), (v, vs)))
            if slots is not None:  # the cached query rows come first: [C, 2, Hk, D]
                if id(slots) not in gathered:
                    gathered[id(slots)] = self.pool[layer].index_select(0, slots)
                kv = gathered[id(slots)]
                ks, vs = (torch.cat([kv[:, i].transpose(0, 1).unsqueeze(0), own], dim=2)
                          for i, own in ((0, ks), (1, vs)))
            o = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=mask, is_causal=mask is None, enable_gqa=True
            )
            out[rows.start:rows.stop] = o.squeeze(0).transpose(0, 1)
        return out
