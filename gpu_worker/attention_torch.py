"""`torch` attention backend: SDPA per sequence with an explicit mask from the packing metadata.

Used on CPU, in CI, and as the reference for the GPU backend. The mask is the multi-item rule
(docs/ARCHITECTURE.md, "The packing contract"), built from prefix_len and block_ends only, never
from token values: block 0 is causal; a row of a later block sees the query rows
[0, prefix_len) and the rows of its own block up to itself.
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


def cached_query_mask(seq: PackedSequence, cached: int) -> torch.Tensor:
    """[L, cached + L] for a sequence whose first `cached` query rows are in the prefix cache
    (gpu_worker/prefix_cache.py): every row sees them all, then what the multi-item rule lets it
    see of its own rows (the query rows left, then its block up to itself)."""
    own = multi_item_mask(seq)
    return torch.cat([torch.ones(seq.num_tokens, cached, dtype=torch.bool), own], dim=1)


class TorchAttention:
    """`plan()` once per batch (the per-sequence masks), then called once per layer.
    `pool`: the prefix cache's K/V, [layers, slots, 2, Hkv, D], or None."""

    def __init__(self, device: torch.device, pool: torch.Tensor | None = None) -> None:
        self.device = device
        self.pool = pool
        self.bounds: list[tuple[int, int]] = []
        self.masks: list[torch.Tensor | None] = []  # None = plain causal
        self.cached: list[torch.Tensor | None] = []  # pool slots of a sequence's cached rows

    def plan(self, sequences: list[PackedSequence], dtype: torch.dtype,
             cached_slots: list[Sequence[int] | None] | None = None) -> tuple[torch.Tensor, ...]:
        """Returns the tensors the batch needs until it finished (masks and slot indices)."""
        self.bounds, self.masks, self.cached, start = [], [], [], 0
        for seq, slots in zip(sequences, cached_slots or [None] * len(sequences), strict=True):
            self.bounds.append((start, start + seq.num_tokens))
            start += seq.num_tokens
            if slots is not None:
                mask = cached_query_mask(seq, len(slots))
                self.cached.append(torch.tensor(slots, dtype=torch.int64, device=self.device))
            else:
                mask = None if len(seq.block_ends) == 1 else multi_item_mask(seq)
                self.cached.append(None)
            self.masks.append(None if mask is None else mask.to(self.device))
        return tuple(t for t in (*self.masks, *self.cached) if t is not None)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 layer: int) -> torch.Tensor:
        out = torch.empty_like(q)
        for (start, end), mask, slots in zip(self.bounds, self.masks, self.cached):
            # SDPA wants [batch, heads, L, D]
            qs, ks, vs = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            if slots is not None:  # the cached query rows come first: [C, 2, Hk, D]
                kv = self.pool[layer].index_select(0, slots)
                ks, vs = (torch.cat([kv[:, i].transpose(0, 1).unsqueeze(0), own], dim=2)
                          for i, own in ((0, ks), (1, vs)))
            o = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=mask, is_causal=mask is None, enable_gqa=True
            )
            out[start:end] = o.squeeze(0).transpose(0, 1)
        return out
