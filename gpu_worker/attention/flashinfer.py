"""`flashinfer` attention backend: the batch's attention blocks as FlashInfer requests (GPU only).

Each attention block of the packing contract (docs/ARCHITECTURE.md, "The packing contract")
becomes one request of BatchPrefillWithPagedKVCacheWrapper over the batch's own K/V, viewed as
pages of one token: its query rows are the block's rows, and its K/V page list is the sequence's
query rows (for every block after the first) followed by the block's own rows. With the causal
mask aligned to the end of that list, an item row sees the query and its own item so far, and
the kernel computes no tile outside it.

A sequence whose first query rows are in the prefix cache (docs/ARCHITECTURE.md, "Prefix
cache") runs without them; its page lists hold those rows where the whole sequence's hold its
query rows, gathered from the cache's pool behind the batch's own rows (once per query). So a
hit is the same kernel call over the same keys in the same order as a miss, and scores what the
miss scored bit for bit (docs/ARCHITECTURE.md, "Deterministic scores").

This layout, not FlashInfer's own multi-item mask (one request per packed sequence with a
per-token item-position table): that mask is tested per element and its tiles span the window of
the longest item, so it costs more (docs/ARCHITECTURE.md, "Engine").
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpu_worker.attention.prefix_cache import kv_pair
from gpu_worker.attention.short_items import (
    short_item_tables,
    short_item_tokens,
    table_capacity,
    tile_tokens,
)
from ranker_contract.model_config import ModelConfig
from ranker_contract.packing import PackedSequence

WORKSPACE_BYTES = 256 << 20

# 0, 1, 2, ...: page lists are copied out of this as slices. A slice is one memory copy, where
# extend(range(...)) converts every index under the GIL: host time the launch path cannot spare
# (docs/ARCHITECTURE.md, "CUDA graphs"). Grown in place when a batch needs more rows.
_ROW_INDICES = array.array("i", range(1 << 16))


def row_indices(start: int, end: int) -> array.array:
    """array('i', range(start, end)), copied from a table instead of built index by index."""
    if end > len(_ROW_INDICES):
        _ROW_INDICES.extend(range(len(_ROW_INDICES), 2 * end))
    return _ROW_INDICES[start:end]


def paged_layout(sequences: list[PackedSequence], cached_rows: list[range | None] | None = None,
                 short: int = 0) -> tuple[list[int], list[int], array.array]:
    """(qo_indptr, kv_indptr, kv_indices) of the batch: one request per attention block, its K/V
    pages the sequence's query rows (blocks after the first) and then the block's rows.
    `cached_rows[i]`: the key rows, after the batch's own, of sequences[i]'s cached query rows
    (cached_gather), first in each of its page lists; None: it has none. `short`: item blocks of
    at most this many rows are the short-item kernel's (gpu_worker/attention/short_items.py):
    each run of them one request over its own rows, whose output the kernel overwrites."""
    qo_indptr, kv_indptr = [0], [0]
    kv_indices = array.array("i")
    offset = 0
    for seq, cached in zip(sequences, cached_rows or [None] * len(sequences), strict=True):
        cached = row_indices(cached.start, cached.stop) if cached else array.array("i")
        query_rows = cached + row_indices(offset, offset + seq.prefix_len)
        ends = seq.block_ends
        start = offset
        block = 0
        while block < len(ends):
            end = offset + ends[block]
            if block and end - start <= short:  # a run of short blocks: its own rows only
                while block + 1 < len(ends) and ends[block + 1] - ends[block] <= short:
                    block += 1
                end = offset + ends[block]
            else:
                kv_indices.extend(query_rows if block else cached)
            kv_indices.extend(row_indices(start, end))
            start = end
            qo_indptr.append(start)
            kv_indptr.append(len(kv_indices))
            block += 1
        offset += seq.num_tokens
    return qo_indptr, kv_indptr, kv_indices


# FlashInfer (the 0.6.6 pyproject.toml pins) plans its query tile, and with it the step its
# K/V loop takes, from a packed row count: an eager plan from the average block's rows x the GQA
# group, a CUDA-graph plan from (bucket rows - requests + 1) x the group. The widest tile (128
# rows; 64 from head_dim 256) is planned above this many packed rows; a row's sum over the keys
# follows the tile (docs/ARCHITECTURE.md, "Deterministic scores").
def widest_tile_above(head_dim: int) -> int:
    return 64 if head_dim < 256 else 16


def add_tile_request(qo_indptr: list[int], kv_indptr: list[int], group: int,
                     head_dim: int) -> int:
    """Where the eager planner would pick a narrower tile than the widest (its blocks average
    too few rows), append a request of no K/V with just enough rows to lift the average over,
    so every batch sums a row's keys in the same steps as a CUDA graph. Returns its rows (0:
    none added). Those rows are past the batch's: planned only (hide_tile_request)."""
    rows, blocks = qo_indptr[-1], len(qo_indptr) - 1
    above = widest_tile_above(head_dim)
    if not blocks or rows * group // blocks > above:
        return 0
    extra = -(-(above + 1) * (blocks + 1) // group) - rows
    qo_indptr.append(rows + extra)
    kv_indptr.append(kv_indptr[-1])
    return extra


def hide_tile_request(wrapper, rows: int) -> None:
    """After plan(): the device copy of the row offsets ends the added request (add_tile_request)
    at the batch's last row, so it has no rows there: its tiles read no query and write no
    output, as they read no K/V. A private field of the wrapper (require_fields)."""
    wrapper._qo_indptr_buf[-1:].fill_(rows)


def require_fields(wrapper, fields: tuple[str, ...], section: str, meanwhile: str) -> None:
    """Fail, naming them, if the wrapper lacks private fields a workaround here writes: they
    are FlashInfer 0.6.6's (the release pyproject.toml pins), and another may lack them."""
    missing = [name for name in fields if not hasattr(wrapper, name)]
    if missing:
        raise RuntimeError(
            f"this FlashInfer has no {', '.join(missing)} on its prefill wrapper: the "
            f"workaround written for the release pyproject.toml pins (docs/ARCHITECTURE.md, "
            f"'{section}') needs revisiting; run with {meanwhile} meanwhile")


def cached_gather(rows: int, cached_slots: list[Sequence[int] | None]
                  ) -> tuple[array.array, list[range | None]]:
    """The pool slots a batch of `rows` rows reads, gathered after its rows, each distinct list
    once (the sequences of one query read the same); and per sequence the key rows of its
    cached query rows (None: none)."""
    gather, placed, cached_rows = array.array("i"), {}, []
    for slots in cached_slots:
        if slots is None:
            cached_rows.append(None)
            continue
        key = array.array("i", slots).tobytes()
        if key not in placed:
            placed[key] = range(rows + len(gather), rows + len(gather) + len(slots))
            gather.extend(slots)
        cached_rows.append(placed[key])
    return gather, cached_rows


def zero_int_workspace(wrapper) -> None:
    """Zero a CUDA-graph wrapper's int workspace (host staging copy and device buffer).

    In CUDA-graph mode without split K/V the prefill kernel runs a fixed grid of CTAs, and
    plan() writes the request and tile indices of the real ones only: the others read whatever
    the int workspace held before, and no mask skips them (FlashInfer issue 4002; PR 5176, open
    as of 0.6.6, adds the mask). Fresh pinned memory is zero (they redo tile 0 of request 0); a
    recycled block still holds another wrapper's indices, out of range here: an illegal memory
    access once an engine was freed in the process (docs/ARCHITECTURE.md, "CUDA graphs"). The
    two buffers are private fields of the wrapper (require_fields)."""
    fields = ("_pin_memory_int_workspace_buffer", "_int_workspace_buffer")
    require_fields(wrapper, fields, "CUDA graphs", "engine.cuda_graphs.enabled: false")
    for name in fields:
        getattr(wrapper, name).zero_()


class _PlanFence:
    """plan() stages its schedule in a pinned buffer that every plan() of the wrapper rewrites;
    the previous plan's copy out of it must have run before the next one overwrites it."""

    def __init__(self) -> None:
        self._copied: torch.cuda.Event | None = None

    def wait(self) -> None:
        if self._copied is not None:
            self._copied.synchronize()

    def issued(self) -> None:
        self._copied = torch.cuda.Event()
        self._copied.record()


def plan_wrapper(wrapper, cfg: ModelConfig, device: torch.device, qo_indptr: list[int],
                 kv_indptr: list[int], kv_indices: array.array, dtype: torch.dtype,
                 causal: bool = True, **kwargs) -> tuple[torch.Tensor, ...]:
    """Plan the given layout (one-token pages); returns the page indices (pinned host and GPU
    copy), which must stay alive until the batch finished. Call inside a _PlanFence."""
    # A fresh pinned tensor each batch, copied without waiting; the kernel reads the copy on
    # the GPU, so both stay referenced (Step.keep_alive) until the batch finished.
    host = torch.frombuffer(kv_indices, dtype=torch.int32).pin_memory()
    kv_indices_gpu = host.to(device, non_blocking=True)
    # NOTE: the indptrs stay on the host: plan() reads them there, so CPU tensors mean no sync.
    wrapper.plan(
        torch.tensor(qo_indptr, dtype=torch.int32), torch.tensor(kv_indptr, dtype=torch.int32),
        kv_indices_gpu, torch.ones(len(qo_indptr) - 1, dtype=torch.int32),  # 1-token pages
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, 1,
        causal=causal, pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype,
        **kwargs,
    )
    return host, kv_indices_gpu


def run_paged(wrapper, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              return_lse: bool = False):
    """The planned attention over the batch's own K/V, as [pages, page_size=1, heads, dim]
    views; the kernel needs one stride for both (CudaOps lays them out so; TorchOps' split
    views need a copy)."""
    if k.stride() != v.stride():
        k, v = k.contiguous(), v.contiguous()
    # The kernel writes every output row (every row sees at least itself), so no zero fill.
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return wrapper.run(q, (k.unsqueeze(1), v.unsqueeze(1)), out=out, return_lse=return_lse)


class FlashInferAttention:
    """One per engine: plans each batch on its FlashInfer wrapper (FlashInferBatchAttention).
    `pool`: the prefix cache's K/V, [layers, slots, 2, Hkv, D], or None. `split_kv`: let
    FlashInfer split a small batch's K/V over more CTAs and merge the parts, a summation order
    that follows the batch (False where scores are deterministic, docs/ARCHITECTURE.md,
    "Deterministic scores")."""

    def __init__(self, cfg: ModelConfig, device: torch.device,
                 pool: torch.Tensor | None = None, split_kv: bool = True) -> None:
        import flashinfer

        self.cfg = cfg
        self.device = device
        self.pool = pool
        self._split = {} if split_kv else {"disable_split_kv": True}
        self._widest_tile = not split_kv  # deterministic: add_tile_request
        self._group = cfg.num_attention_heads // cfg.num_key_value_heads
        self.workspace_gpu = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace_gpu, "NHD", backend="fa2")
        if self._widest_tile:
            require_fields(self.wrapper, ("_qo_indptr_buf",), "Deterministic scores",
                           "engine.deterministic: false")
        self._fence = _PlanFence()
        self.plans = 0  # plan() calls so far: the wrapper holds the last one's
        self.short = short_item_tokens(cfg)  # item blocks the short-item kernel computes
        self._tile = tile_tokens(cfg)

    def plan(self, sequences: list[PackedSequence], dtype: torch.dtype,
             cached_slots: list[Sequence[int] | None] | None = None
             ) -> FlashInferBatchAttention:
        gather, cached_rows = cached_gather(sum(seq.num_tokens for seq in sequences),
                                            cached_slots or [None] * len(sequences))
        qo_indptr, kv_indptr, kv_indices = paged_layout(sequences, cached_rows, self.short)
        rows = qo_indptr[-1]
        added = self._widest_tile and add_tile_request(qo_indptr, kv_indptr, self._group,
                                                       self.cfg.head_dim)
        self._fence.wait()
        keep = plan_wrapper(self.wrapper, self.cfg, self.device, qo_indptr, kv_indptr,
                            kv_indices, dtype, **self._split)
        if added:
            hide_tile_request(self.wrapper, rows)
        self._fence.issued()
        self.plans += 1
        gather_gpu = short = None
        if gather:
            host = torch.frombuffer(gather, dtype=torch.int32).pin_memory()
            gather_gpu = host.to(self.device, non_blocking=True)
            keep += (host, gather_gpu)
        tiles, items = short_item_tables(sequences, cached_rows, self.short, self._tile)
        if tiles:
            host = torch.frombuffer(tiles + items, dtype=torch.int32).pin_memory()
            tables = host.to(self.device, non_blocking=True)
            short = ShortItems(tables[:len(tiles)].view(-1, 8), tables[len(tiles):].view(-1, 2),
                               self.short)
            keep += (host, tables)
        return FlashInferBatchAttention(self, self.plans, gather_gpu, short, keep)


@dataclass(slots=True)
class ShortItems:
    """A batch's tables for the short-item kernel (gpu_worker/attention/short_items.py), on the
    device: its rows of `out` are the kernel's, written after FlashInfer's."""

    tiles: torch.Tensor  # [n, 8] int32
    items: torch.Tensor  # [m, 2] int32
    item_tokens: int

    def write(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor
              ) -> torch.Tensor:
        from gpu_worker.kernels.short_item_attention import short_item_attention

        short_item_attention(q, k, v, out, self.tiles, self.items, self.item_tokens)
        return out


class FlashInferBatchAttention:
    """One batch's attention on its backend's wrapper, called once per layer. A FlashInfer
    wrapper holds one plan at a time, so this one runs only until the backend plans the next
    batch: the engine queues a batch's whole forward before it plans another, and a call after
    that is refused, never run on another batch's plan. `gather`: the pool slots of the
    batch's cached query rows (cached_gather), or None; `short`: its short items' tables, or
    None (it has none); `keep_alive`: the tensors the kernels read until the batch finished."""

    def __init__(self, backend: FlashInferAttention, plan: int, gather: torch.Tensor | None,
                 short: ShortItems | None, keep_alive: tuple[torch.Tensor, ...]) -> None:
        self.backend, self.number = backend, plan
        self.gather = gather
        self.short = short
        self.keep_alive = keep_alive

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 layer: int) -> torch.Tensor:
        if self.number != self.backend.plans:
            raise RuntimeError("this batch's attention plan was replaced by a later batch's")
        wrapper = self.backend.wrapper
        if self.gather is not None:
            # The batch's K/V, then the cached rows it reads: [T + C, 2, Hk, D], one copy each.
            rows = k.shape[0]
            kv = torch.empty((rows + len(self.gather), 2, *k.shape[1:]), dtype=k.dtype,
                             device=k.device)
            kv[:rows] = kv_pair(k, v)
            torch.index_select(self.backend.pool[layer], 0, self.gather, out=kv[rows:])
            k, v = kv[:, 0], kv[:, 1]
        out = run_paged(wrapper, q, k, v)
        return out if self.short is None else self.short.write(q, k, v, out)


class FlashInferGraphAttention:
    """The same attention for a CUDA-graph bucket of exactly `tokens` rows
    (gpu_worker/forward/graphs.py).

    A captured kernel reads its metadata from fixed addresses with a fixed batch size, so every
    batch is padded to the bucket: the real requests, then one padding request holding the rows
    up to `tokens` (attending only among themselves), then empty requests up to
    `max_requests + 1`. FlashInfer's CUDA-graph mode keeps its indptr and index buffers fixed
    and, given the same row total and request count, plans the same tiles, so the launch
    arguments captured once stay valid; only the buffers change. Nothing reads the padding rows.
    Batches that use the prefix cache run eagerly (docs/ARCHITECTURE.md, "Prefix cache").
    The object itself is the attention of the ForwardBatch its graph was captured on: plan()
    rewrites those buffers for each batch that replays it.
    """

    def __init__(self, cfg: ModelConfig, device: torch.device, tokens: int, items: int,
                 max_requests: int, kv_capacity: int, workspace_gpu: torch.Tensor) -> None:
        import flashinfer

        self.cfg = cfg
        self.device = device
        self.tokens = tokens
        self.max_requests = max_requests
        slots = max_requests + 1  # + the padding request
        i32 = dict(dtype=torch.int32, device=device)
        # `workspace_gpu`: scratch shared by all buckets, as one stream runs them.
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            workspace_gpu, "NHD", backend="fa2", use_cuda_graph=True,
            qo_indptr_buf=torch.zeros(slots + 1, **i32),
            paged_kv_indptr_buf=torch.zeros(slots + 1, **i32),
            paged_kv_indices_buf=torch.zeros(kv_capacity + tokens, **i32),
            paged_kv_last_page_len_buf=torch.ones(slots, **i32))
        zero_int_workspace(self.wrapper)
        self._fence = _PlanFence()
        # The short-item kernel's tables at their most for the bucket, padded with empty tiles:
        # every replay launches the kernel over all of them.
        self.short = short_item_tokens(cfg)
        self._tile = tile_tokens(cfg)
        self._short_items = None
        if self.short:
            n_tiles, n_items = table_capacity(tokens, items, self.short, self._tile)
            tables = torch.zeros(8 * n_tiles + 2 * n_items, **i32)
            self._short_items = ShortItems(tables[:8 * n_tiles].view(-1, 8),
                                           tables[8 * n_tiles:].view(-1, 2), self.short)
            self._tables = tables

    def plan(self, sequences: list[PackedSequence], dtype: torch.dtype
             ) -> tuple[torch.Tensor, ...]:
        """Write the batch's layout into the graph's buffers; returns the tensors that must stay
        alive until the batch finished."""
        qo_indptr, kv_indptr, kv_indices = paged_layout(sequences, short=self.short)
        kv_indices.extend(row_indices(qo_indptr[-1], self.tokens))  # the padding request
        qo_indptr.append(self.tokens)
        kv_indptr.append(len(kv_indices))
        empty = self.max_requests + 2 - len(qo_indptr)
        qo_indptr.extend([self.tokens] * empty)
        kv_indptr.extend([len(kv_indices)] * empty)
        self._fence.wait()
        # CUDA-graph mode would otherwise always split K/V and merge the parts: one more kernel,
        # and a summation order that differs from the eager path's.
        keep = plan_wrapper(self.wrapper, self.cfg, self.device, qo_indptr, kv_indptr,
                            kv_indices, dtype, disable_split_kv=True)
        self._fence.issued()
        if self._short_items is not None:
            tiles, items = short_item_tables(sequences, [None] * len(sequences), self.short,
                                             self._tile)
            short = self._short_items
            zero = array.array("i", [0])
            tables = (tiles + zero * (short.tiles.numel() - len(tiles))
                      + items + zero * (short.items.numel() - len(items)))
            host = torch.frombuffer(tables, dtype=torch.int32).pin_memory()
            self._tables.copy_(host, non_blocking=True)
            keep += (host,)
        return keep

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 layer: int) -> torch.Tensor:
        out = run_paged(self.wrapper, q, k, v)
        return out if self._short_items is None else self._short_items.write(q, k, v, out)
