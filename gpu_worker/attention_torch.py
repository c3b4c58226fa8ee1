"""`torch` attention backend: SDPA per sequence with an explicit mask from the packing metadata.

Used on CPU, in CI, and as the reference for the GPU backend. The mask is the multi-item rule
(docs/ARCHITECTURE.md, "The packing contract"), built from prefix_len and token_pos_in_items
only, never from token values:
a row p < prefix_len is causal; a row p >= prefix_len with item position t sees the prefix and
the t most recent tokens (its own item so far).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ranker_contract.packing import PackedSequence


def multi_item_mask(seq: PackedSequence) -> torch.Tensor:
    """[L, L] bool, True = attend.

    NOTE: delimiter rows (t = 0) also see themselves here, so no row is fully masked (SDPA
    would return NaN for it). Nothing reads or attends to delimiter rows, so scores are unchanged.
    """
    n, p = seq.num_tokens, seq.prefix_len
    rows = torch.arange(n)[:, None]  # [L, 1]
    cols = torch.arange(n)[None, :]  # [1, L]
    item_pos = torch.tensor(seq.token_pos_in_items, dtype=torch.int64).clamp(min=1)
    window_start = torch.cat([torch.zeros(p, dtype=torch.int64), torch.arange(p, n) - item_pos + 1])
    return (cols <= rows) & ((cols < p) | (cols >= window_start[:, None]))


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
            plain = seq.prefix_len == seq.num_tokens
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
