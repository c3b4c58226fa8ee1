"""The query-prefix K/V cache of a scorer replica (docs/ARCHITECTURE.md, "Prefix cache").

The K/V of a multi-item sequence's query rows, exactly as attention read them (after k-norm and
RoPE at positions 0..P-1), stay in a pool of token slots per layer, in pages of `page_tokens`
query tokens (the query's last page may be shorter). A page is found by a digest chained over the
query's ids up to its end, so a lookup finds the longest cached prefix of a query: all of it
when the same query comes back, its first pages when another query starts alike (a rerank
template's instruction, a history that grew). A sequence with C cached tokens (a hit when C is
the whole query, else a partial hit) runs without its first C rows: its remaining query rows
and every item block attend to the cached slots, read in place in the pool, and to their own
rows, positions unchanged, so it computes what the whole sequence would have at the item rows.
The query rows it computes are copied into new pages as each layer runs, before that layer's
attention: any sequence of the same batch already reads them.

Only queries (never item rows) are cached, keyed on their exact token ids and on the adapter
whose K/V they are (an `owner`: b"" for the model alone): a pool belongs to one engine, so
model, dtype and precision are fixed. Pages are evicted least-recently used, a query's deeper
pages before its first ones. Nothing here waits on the GPU: every batch runs on one CUDA
stream, so a batch that evicts a page and writes its slots runs after every earlier batch that
read them; a batch never evicts a page it uses itself (else it computes the rest of the query
without keeping it: a bypass).
"""

from __future__ import annotations

import array
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from ranker_contract.model_config import ModelConfig
from ranker_contract.packing import PackedSequence, cacheable_query


@dataclass(slots=True)
class PrefixCacheStats:
    """Running totals (read by the metrics thread; only the scheduling loop writes them).
    Each cacheable sequence counts once: hit (its whole query cached), partial (a prefix of
    it), miss (none; its query kept) or bypass (not all of it cached, and no room to keep it)."""

    hits: int = 0
    partial_hits: int = 0
    misses: int = 0
    bypasses: int = 0
    tokens_reused: int = 0  # query tokens not computed thanks to the cache
    evictions: int = 0  # pages
    cached_tokens: int = 0  # slots held now

    def lookups(self) -> dict[str, int]:
        """The lookups so far by result, named as the metrics label them."""
        return {"hit": self.hits, "partial": self.partial_hits, "miss": self.misses,
                "bypass": self.bypasses}


@dataclass(slots=True)
class CachePlan:
    """What one batch does with the cache. `sequences` are the batch's sequences, in order, as
    the engine runs them: without their cached query rows. `cached_slots[i]` holds the pool
    slots of sequences[i]'s cached query rows, in query order, or None."""

    sequences: list[PackedSequence] = field(default_factory=list)
    cached_slots: list[array.array | None] = field(default_factory=list)
    insert_rows: list[int] = field(default_factory=list)  # batch rows copied into the pool...
    insert_slots: list[int] = field(default_factory=list)  # ...at these slots
    inserted: list[bytes] = field(default_factory=list)  # pages this batch fills


@dataclass(slots=True)
class _Page:
    ids: bytes  # its own query tokens: checked on every hit (a digest is not a proof)
    slots: array.array  # int32, one per token


def cached_form(seq: PackedSequence, cached: int) -> PackedSequence:
    """`seq` without its first `cached` rows (all query rows): the query rows left become its
    prefix, positions unchanged. With the whole query cached, block 0 is the lone delimiter."""
    return PackedSequence(
        input_ids=seq.input_ids[cached:],
        positions=seq.positions[cached:],
        prefix_len=seq.prefix_len - cached,
        block_ends=[end - cached for end in seq.block_ends],
        score_rows=[row - cached for row in seq.score_rows],
        item_offset=seq.item_offset,
    )


def page_keys(raw: bytes, page_tokens: int, owner: bytes = b"") -> list[tuple[bytes, bytes]]:
    """(digest, ids) of each page of a query given as int32 bytes: the digest chains the owner
    and every id up to the page's end."""
    pages, digest, step = [], owner, 4 * page_tokens
    for start in range(0, len(raw), step):
        ids = raw[start:start + step]
        digest = hashlib.blake2b(digest + ids, digest_size=16).digest()
        pages.append((digest, ids))
    return pages


# Page keys of this many recent queries are kept: a repeated query (what the cache is for) costs
# one dict lookup instead of a digest per page, which costs the launch path on long queries.
RECENT_QUERIES = 256


class PrefixCache:
    def __init__(self, cfg: ModelConfig, capacity_tokens: int, min_tokens: int,
                 min_share: float, page_tokens: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        # K and V of a slot side by side: one copy per layer inserts both (InsertingAttention),
        # and an attention backend reads the pool in place as one page per slot.
        shape = (cfg.num_hidden_layers, capacity_tokens, 2, cfg.num_key_value_heads, cfg.head_dim)
        self.kv = torch.empty(shape, dtype=dtype, device=device)
        self.capacity = capacity_tokens
        self.min_tokens = min_tokens
        self.min_share = min_share
        self.page_tokens = page_tokens
        self.free = array.array("i", range(capacity_tokens))  # compact: no GC scans it
        self.pages: OrderedDict[bytes, _Page] = OrderedDict()  # digest → page, LRU first
        self.stats = PrefixCacheStats()
        self._recent_keys: OrderedDict[tuple[bytes, bytes],
                                       list[tuple[bytes, bytes]]] = OrderedDict()

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
        return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * dtype.itemsize

    def may_keep(self, seq: PackedSequence) -> bool:
        return cacheable_query(seq, self.min_tokens, self.min_share)

    def plan(self, sequences: list[PackedSequence],
             owners: list[bytes] | None = None) -> CachePlan:
        """Look up, insert and evict for one batch (host work only). `owners[i]`: whose K/V
        sequences[i] computes (its adapter's key; b"" or no list: the model alone)."""
        used: set[bytes] = set()  # pages this batch reads or writes: never evicted by it
        plan, row = CachePlan(), 0
        for index, seq in enumerate(sequences):
            cached, new_slots = None, None
            if self.may_keep(seq):
                query = seq.prefix_len
                keys = self._keys(seq.input_ids[:query],
                                  owners[index] if owners else b"")
                found = 0  # pages cached, from the first
                while found < len(keys) and self._has(*keys[found]):
                    found += 1
                if found:
                    cached = array.array("i")
                    for digest, _ in keys[:found]:
                        cached.extend(self.pages[digest].slots)
                    seq = cached_form(seq, len(cached))
                used.update(digest for digest, _ in keys[:found])
                new_slots = self._allocate(keys[found:], used)
                self._count(query, len(cached) if found else 0, new_slots is not None)
                for digest, _ in reversed(keys[:found] if new_slots is None else keys):
                    self.pages.move_to_end(digest)  # first pages most recent: evicted last
                if new_slots is not None:
                    plan.inserted.extend(digest for digest, _ in keys[found:])
            if new_slots:  # the query rows a sequence computes come first
                plan.insert_rows.extend(range(row, row + len(new_slots)))
                plan.insert_slots.extend(new_slots)
            plan.sequences.append(seq)
            plan.cached_slots.append(cached)
            row += seq.num_tokens
        self.stats.cached_tokens = self.capacity - len(self.free)
        return plan

    def _keys(self, query: list[int], owner: bytes) -> list[tuple[bytes, bytes]]:
        recent = (owner, array.array("i", query).tobytes())
        keys = self._recent_keys.get(recent)
        if keys is None:
            keys = self._recent_keys[recent] = page_keys(recent[1], self.page_tokens, owner)
            if len(self._recent_keys) > RECENT_QUERIES:
                self._recent_keys.popitem(last=False)
        else:
            self._recent_keys.move_to_end(recent)
        return keys

    def _has(self, digest: bytes, ids: bytes) -> bool:
        page = self.pages.get(digest)
        return page is not None and page.ids == ids

    def _count(self, query: int, cached: int, kept: bool) -> None:
        if cached == query:
            self.stats.hits += 1
        elif not kept:
            self.stats.bypasses += 1
        elif cached:
            self.stats.partial_hits += 1
        else:
            self.stats.misses += 1
        self.stats.tokens_reused += cached

    def clear(self) -> None:
        """Empty, counters at zero (after the start-up warm-up)."""
        self.free = array.array("i", range(self.capacity))
        self.pages.clear()
        self._recent_keys.clear()
        for name in PrefixCacheStats.__slots__:  # in place: the metrics thread holds it
            setattr(self.stats, name, 0)

    def forget(self, plan: CachePlan) -> None:
        """Drop the pages `plan` was to fill: its batch failed before computing them."""
        for digest in plan.inserted:
            page = self.pages.pop(digest, None)
            if page is not None:
                self.free.extend(page.slots)
        self.stats.cached_tokens = self.capacity - len(self.free)

    def _allocate(self, keys: list[tuple[bytes, bytes]],
                  used: set[bytes]) -> array.array | None:
        """Slots for the pages `keys` (all or none, in order), evicting least-recently used
        pages this batch does not use; the pages are in the index when it returns."""
        for digest, _ in keys:  # a page left without its first ones is never read: replace it
            if digest in self.pages and digest not in used:
                self.free.extend(self.pages.pop(digest).slots)
        tokens = sum(len(ids) // 4 for _, ids in keys)
        if tokens > self.capacity:
            return None
        while len(self.free) < tokens:
            # The least recently used page this batch does not use: at or near the front, so
            # a miss in a pool of thousands of pages costs no scan of them all.
            digest = next((d for d in self.pages if d not in used), None)
            if digest is None:
                return None
            self.free.extend(self.pages.pop(digest).slots)
            self.stats.evictions += 1
        slots = self.free[len(self.free) - tokens:]
        del self.free[len(self.free) - tokens:]
        at = 0
        for digest, ids in keys:
            n = len(ids) // 4
            self.pages[digest] = _Page(ids, slots[at:at + n])
            used.add(digest)
            at += n
        return slots


def kv_pair(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[T, 2, Hk, D] holding k and v: a view when v follows k in each row of one buffer (the
    fused QKV layout of CudaOps, gpu_worker/kernels/qkv.py), else a stacked copy (TorchOps)."""
    t, heads, dim = k.shape
    if (v.data_ptr() == k.data_ptr() + heads * dim * k.element_size()
            and k.stride() == v.stride() == (k.stride(0), dim, 1)):
        return k.as_strided((t, 2, heads, dim), (k.stride(0), heads * dim, dim, 1))
    return torch.stack([k, v], dim=1)


class InsertingAttention:
    """An attention backend that first copies the batch's new query rows into the pool, each
    layer's before that layer's attention reads the pool (gpu_worker/attention/prefix_cache.py). K
    and V move together: two ops per layer, each tens of µs of host time on the launch path."""

    def __init__(self, inner, pool: torch.Tensor, insert_rows: torch.Tensor,
                 insert_slots: torch.Tensor) -> None:
        self.inner = inner
        self.pool = pool
        self.insert_rows, self.insert_slots = insert_rows, insert_slots

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 layer: int) -> torch.Tensor:
        self.pool[layer].index_copy_(0, self.insert_slots,
                                     kv_pair(k, v).index_select(0, self.insert_rows))
        return self.inner(q, k, v, layer)
