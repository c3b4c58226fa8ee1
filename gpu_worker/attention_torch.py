"""`torch` attention backend: SDPA per sequence with an explicit mask from the packing metadata.

Used on CPU, in CI, and as the reference for the GPU backend. The mask is the multi-item rule
(docs/ARCHITECTURE.md, "The packing contract"), built from prefix_len and block_ends only, never
from token values: block 0 is causal; a row of a later block sees the query rows
[0, prefix_len) and the rows of its own block up to itself.
"""

from __future__ import annotations

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


class TorchAttention:
    """`plan()` once per batch (the per-sequence masks), then called once per layer."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bounds: list[tuple[int, int]] = []
        self.masks: list[torch.Tensor | None] = []  # None = plain causal

    def plan(self, sequences: list[PackedSequence], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """Returns the tensors the batch needs until it finished (the masks)."""
        self.bounds, self.masks, start = [], [], 0
        for seq in sequences:
            self.bounds.append((start, start + seq.num_tokens))
            start += seq.num_tokens
            plain = len(seq.block_ends) == 1
            self.masks.append(None if plain else multi_item_mask(seq).to(self.device))
        return tuple(m for m in self.masks if m is not None)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        for (start, end), mask in zip(self.bounds, self.masks):
            # SDPA wants [batch, heads, L, D]
            qs, ks, vs = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            o = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=mask, is_causal=mask is None, enable_gqa=True
            )
            out[start:end] = o.squeeze(0).transpose(0, 1)
        return out
