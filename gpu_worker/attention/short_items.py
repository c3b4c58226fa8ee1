"""Which item blocks of a batch take the short-item kernel, and its tables
(docs/ARCHITECTURE.md, "Short items").

An item block of at most SHORT_ITEM_TOKENS rows is short: as a FlashInfer request of its own it
would fill one query tile of 128 rows with its few (a 10-token item and its delimiter: 22 rows
with two query heads per K/V head), so a slate of hundreds of them runs hundreds of mostly empty
tiles per layer. gpu_worker/kernels/short_item_attention.py computes them instead, in tiles cut
from each sequence's consecutive short blocks. Whether a block is short follows from its own
length only, so an item takes the same kernel, and the same steps, in every batch.

FlashInfer still gets a request for those rows, so that its layout covers every row: one per
run of consecutive short blocks, over its own rows only (a few full tiles, reading no query
key), whose output the kernel then overwrites.
"""

from __future__ import annotations

import array

from ranker_contract.model_config import ModelConfig
from ranker_contract.packing import PackedSequence

SHORT_ITEM_TOKENS = 32  # the longest short item block (item and delimiter), a power of two


def block_m(head_dim: int) -> int:
    """The kernel's query rows per tile: as many as the registers hold beside a [rows,
    head_dim] fp32 sum."""
    return 128 if head_dim <= 128 else 64


def supported(num_heads: int, num_kv_heads: int, head_dim: int, item_tokens: int) -> bool:
    """Whether the kernel takes this shape: power-of-two widths its tiles divide."""
    def power_of_two(n: int) -> bool:
        return n > 0 and n & (n - 1) == 0

    group = num_heads // num_kv_heads
    return (num_heads % num_kv_heads == 0 and power_of_two(group) and power_of_two(head_dim)
            and head_dim >= 16 and block_m(head_dim) % group == 0
            and power_of_two(item_tokens) and item_tokens >= 16)


def short_item_tokens(cfg: ModelConfig) -> int:
    """SHORT_ITEM_TOKENS where the kernel takes the model's attention shape, else 0 (every
    block goes to FlashInfer)."""
    return SHORT_ITEM_TOKENS if supported(cfg.num_attention_heads, cfg.num_key_value_heads,
                                          cfg.head_dim, SHORT_ITEM_TOKENS) else 0


def tile_tokens(cfg: ModelConfig) -> int:
    """The tokens of one tile: its query rows ÷ the query heads per K/V head."""
    return block_m(cfg.head_dim) // (cfg.num_attention_heads // cfg.num_key_value_heads)


def short_runs(seq: PackedSequence, short: int) -> list[list[tuple[int, int]]]:
    """The sequence's runs of consecutive short item blocks, each a list of (first row, end
    row) of its blocks, rows counted from the sequence's first. `short`: 0, none."""
    runs: list[list[tuple[int, int]]] = []
    start = seq.block_ends[0]
    for end in seq.block_ends[1:] if short else ():
        if end - start <= short:
            if runs and runs[-1][-1][1] == start:
                runs[-1].append((start, end))
            else:
                runs.append([(start, end)])
        start = end
    return runs


def short_item_tables(sequences: list[PackedSequence], cached_rows: list[range | None],
                      short: int, tile: int) -> tuple[array.array, array.array]:
    """The kernel's `tiles` and `items` tables (int32, flat; gpu_worker/kernels/
    short_item_attention.py) for the batch: each sequence's runs of short blocks cut into tiles
    of `tile` tokens. `cached_rows[i]`: the key rows of sequences[i]'s cached query rows
    (flashinfer.cached_gather), or None."""
    tiles, items = array.array("i"), array.array("i")
    offset = 0
    for seq, cached in zip(sequences, cached_rows, strict=True):
        cached_at, n_cached = (cached.start, len(cached)) if cached else (0, 0)
        for blocks in short_runs(seq, short):
            at = 0  # the first block that may overlap the next tile
            for tile_first in range(blocks[0][0], blocks[-1][1], tile):
                tile_end = min(tile_first + tile, blocks[-1][1])
                while blocks[at][1] <= tile_first:
                    at += 1
                first_item, last = len(items) // 2, at
                while last < len(blocks) and blocks[last][0] < tile_end:
                    items.extend((offset + blocks[last][0], blocks[last][1] - blocks[last][0]))
                    last += 1
                tiles.extend((offset + tile_first, offset + tile_end, cached_at, n_cached,
                              offset, seq.prefix_len, first_item, last - at))
        offset += seq.num_tokens
    return tiles, items


def table_capacity(tokens: int, rows: int, short: int, tile: int) -> tuple[int, int]:
    """The most tiles and items the tables of a batch of `tokens` rows and `rows` items can
    hold (a CUDA graph's fixed tables): each run of short blocks (at most one per item) may end
    in a part tile, and an item of at most `short` rows overlaps at most ⌈short ÷ tile⌉ + 1."""
    return tokens // tile + rows, rows * (-(-short // tile) + 1)
