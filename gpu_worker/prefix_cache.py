"""The query-prefix K/V cache of a scorer replica (docs/ARCHITECTURE.md, "Prefix cache").

The K/V of a multi-item sequence's query rows, exactly as attention read them (after k-norm and
RoPE at positions 0..P-1), stay in a pool of token slots per layer. A later sequence with the
same query ids (a hit) runs only its item blocks: its rows drop `Q D`, every item block attends
to the cached query slots and to itself, and its positions stay P + j as before, so it computes
what the whole sequence would have at the item rows. A miss computes as before and copies its
query rows into free slots as each layer runs; a later sequence of the same batch already hits
them (same layer, later in the stream).

Only queries (never item rows) are cached, keyed on their exact token ids: a pool belongs to
one engine, so model, dtype and precision are fixed. Entries are evicted least-recently used.
Nothing here waits on the GPU: every batch runs on one CUDA stream, so a batch that evicts an
entry and writes its slots runs after every earlier batch that read them; a batch never evicts
an entry it uses itself (else it computes the query without caching it: a bypass).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from ranker_contract.model_config import ModelConfig
from ranker_contract.packing import PackedSequence, cacheable_query, query_bytes


@dataclass(slots=True)
class PrefixCacheStats:
    """Running totals (read by the metrics thread; only the scheduling loop writes them)."""

    hits: int = 0
    misses: int = 0  # computed and inserted
    bypasses: int = 0  # computed, not inserted: the pool was held by the batch's own entries
    tokens_reused: int = 0  # query tokens not computed thanks to a hit
    evictions: int = 0
    cached_tokens: int = 0  # slots held now


@dataclass(slots=True)
class CachePlan:
    """What one batch does with the cache. `sequences` are the batch's rows as the engine runs
    them (hits without their `Q D`); `cached_queries[i]` is (start, length) of sequence i's query
    K/V in the rows `attend` appends after the batch's own, or None."""

    sequences: list[PackedSequence]
    cached_queries: list[tuple[int, int] | None]
    insert_rows: list[int] = field(default_factory=list)  # batch rows copied into the pool...
    insert_slots: list[int] = field(default_factory=list)  # ...at these slots
    gather_slots: list[int] = field(default_factory=list)  # slots appended after the batch rows
    inserted: list[bytes] = field(default_factory=list)  # entries this batch fills

    @property
    def active(self) -> bool:
        return bool(self.insert_rows or self.gather_slots)


def hit_form(seq: PackedSequence) -> PackedSequence:
    """`seq` without its `Q D` rows: its item blocks, positions unchanged, prefix_len 0 (the
    query comes from the cache)."""
    cut = seq.prefix_len + 1
    return PackedSequence(
        input_ids=seq.input_ids[cut:],
        positions=seq.positions[cut:],
        prefix_len=0,
        block_ends=[end - cut for end in seq.block_ends[1:]],
        score_rows=[row - cut for row in seq.score_rows],
        item_offset=seq.item_offset,
    )


class PrefixCache:
    def __init__(self, cfg: ModelConfig, capacity_tokens: int, min_tokens: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (cfg.num_hidden_layers, capacity_tokens, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.min_tokens = min_tokens
        self.free = list(range(capacity_tokens))
        self.entries: OrderedDict[bytes, list[int]] = OrderedDict()  # query ids → slots, LRU first
        self.stats = PrefixCacheStats()

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
        return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * dtype.itemsize

    def plan(self, sequences: list[PackedSequence]) -> CachePlan:
        """Look up, insert and evict for one batch (host work only)."""
        used: set[bytes] = set()  # entries this batch reads or writes: never evicted by it
        gathered: dict[bytes, int] = {}  # entry → start of its rows appended after the batch
        forms: list[PackedSequence] = []
        cached: list[tuple[int, int] | None] = []
        inserts: list[tuple[int, list[int]]] = []  # (index in forms, slots)
        plan = CachePlan(forms, cached)
        for seq in sequences:
            if not cacheable_query(seq, self.min_tokens):
                forms.append(seq)
                cached.append(None)
                continue
            key = query_bytes(seq)
            slots = self.entries.get(key)
            if slots is not None:
                self.entries.move_to_end(key)
                if key not in gathered:
                    gathered[key] = len(plan.gather_slots)
                    plan.gather_slots.extend(slots)
                used.add(key)
                forms.append(hit_form(seq))
                cached.append((gathered[key], seq.prefix_len))
                self.stats.hits += 1
                self.stats.tokens_reused += seq.prefix_len
                continue
            slots = self._allocate(seq.prefix_len, used)
            if slots is None:
                self.stats.bypasses += 1
            else:
                self.entries[key] = slots
                plan.inserted.append(key)
                used.add(key)
                inserts.append((len(forms), slots))
                self.stats.misses += 1
            forms.append(seq)
            cached.append(None)
        starts = [0]
        for seq in forms:
            starts.append(starts[-1] + seq.num_tokens)
        for index, slots in inserts:
            plan.insert_rows.extend(range(starts[index], starts[index] + len(slots)))
            plan.insert_slots.extend(slots)
        self.stats.cached_tokens = len(self.k[0]) - len(self.free)
        return plan

    def forget(self, plan: CachePlan) -> None:
        """Drop the entries `plan` was to fill: its batch failed before computing them."""
        for key in plan.inserted:
            slots = self.entries.pop(key, None)
            if slots is not None:
                self.free.extend(slots)
        self.stats.cached_tokens = len(self.k[0]) - len(self.free)

    def _allocate(self, tokens: int, used: set[bytes]) -> list[int] | None:
        """`tokens` free slots, evicting least-recently used entries the batch does not use."""
        if tokens > len(self.k[0]):
            return None
        while len(self.free) < tokens:
            # The least recently used entry this batch does not use: at or near the front, so
            # a miss in a pool of thousands of entries costs no scan of them all.
            key = next((k for k in self.entries if k not in used), None)
            if key is None:
                return None
            self.free.extend(self.entries.pop(key))
            self.stats.evictions += 1
        slots = self.free[len(self.free) - tokens:]
        del self.free[len(self.free) - tokens:]
        return slots


class CachedAttention:
    """An attention backend with one batch's CachePlan applied to each layer's K/V first: the
    missed queries' rows are copied into the pool, then the hits' cached rows are appended
    after the batch's own (where the backend's plan points their blocks)."""

    def __init__(self, inner, cache: PrefixCache, insert_rows: torch.Tensor,
                 insert_slots: torch.Tensor, gather_slots: torch.Tensor) -> None:
        self.inner = inner
        self.cache = cache
        self.insert_rows, self.insert_slots = insert_rows, insert_slots
        self.gather_slots = gather_slots

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 layer: int) -> torch.Tensor:
        pool_k, pool_v = self.cache.k[layer], self.cache.v[layer]
        if len(self.insert_rows):
            pool_k.index_copy_(0, self.insert_slots, k.index_select(0, self.insert_rows))
            pool_v.index_copy_(0, self.insert_slots, v.index_select(0, self.insert_rows))
        if len(self.gather_slots):
            k = torch.cat([k, pool_k.index_select(0, self.gather_slots)])
            v = torch.cat([v, pool_v.index_select(0, self.gather_slots)])
        return self.inner(q, k, v, layer)
