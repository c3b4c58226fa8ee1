"""What a scorer replica does once before it reports ready: size the prefix cache's pool, measure
the batch budget (measure_budget) and run every kernel variant a batch can need (warm_up), so
nothing compiles on the request path (docs/ARCHITECTURE.md, "Start-up"). All its batches are of
one shape, the bench's (QUERY_TOKENS, ITEM_TOKENS).

Triton compiles a kernel on its first call and again for each new specialization of its
arguments (each integer and pointer argument is specialized on being 16-divisible). So:
- the fused gate/up kernel runs only from FUSED_GATE_UP_MIN_TOKENS rows: the budget-sized
  batches here reach it (the memory probe's batch is smaller);
- the positions a batch passes are a view into one metadata tensor after its T token ids
  (gpu_worker/forward/host_tensors.py), 16-aligned for an even T only: both parities run;
- FlashInfer builds its modules on the first plan() of multi-item and of plain (empty-query)
  layouts, and the longest sequence sets the largest positions and attention rows.
- with a prefix cache, a batch that fills it and a budget's worth that reads it run once too
  (cached_warm_up_batches): a reader attends over a per-layer copy of its K/V and the pool
  rows it reads, memory the probe's batch did not hold.
Graph buckets are captured at start-up already; the batches here run eagerly, as under load,
which also grows the memory pools to their working size.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ranker_contract.packing import (
    PackedSequence,
    cacheable_query,
    multi_item_length,
    pack_multi_item,
    pack_plain,
)

logger = logging.getLogger(__name__)

QUERY_TOKENS, ITEM_TOKENS = 120, 180  # the bench shape; other shapes differ only in sizes
# Share of free GPU memory (after weights) that batch activations, or the prefix cache, may use.
MEMORY_FRACTION = 0.8
PROBE_TOKENS = 8192  # the probe batch: about one bench-sized batch slice
# The CPU's probe batch: one bench-shape sequence or two, a few seconds of a 2-core machine
CPU_PROBE_TOKENS = 1024
# Label ids of the probe and warm-up batches: 0 exists in a vocabulary and in a one-class head.
PROBE_LABEL_IDS = [0, 0]


@dataclass(frozen=True, slots=True)
class BatchBudget:
    """What the warm-up probe measured (measure_budget)."""

    tokens: int  # tokens one batch may hold: the scheduler's batch_token_budget
    # Tokens per second of the probe batch (eager): where the load bound's throughput estimate
    # starts, so a scorer refuses from its first request on, and what the autoscaler compares
    # the computed rate with. Batches under load are larger and faster per token on a GPU, so
    # the share it gives reads somewhat high there.
    capacity_tokens_per_s: float


def check_pool_fits(tokens: int, bytes_per_token: int, device: torch.device) -> None:
    """The prefix cache's pool is allocated before the batch budget is measured, so the budget
    is what memory it leaves; it may take at most MEMORY_FRACTION of what is free."""
    need = tokens * bytes_per_token
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if need > MEMORY_FRACTION * free:
            raise RuntimeError(
                f"engine.prefix_cache.tokens={tokens} needs {need / 2**30:.1f} GiB of K/V, more "
                f"than {MEMORY_FRACTION:.0%} of the {free / 2**30:.1f} GiB free after the "
                "weights: lower it")
    logger.info("prefix cache: %d tokens, %.2f GiB", tokens, need / 2**30)


def _run(engine, batch: list[PackedSequence], **launch) -> None:
    engine.finish(engine.launch(batch, [PROBE_LABEL_IDS] * len(batch), **launch))


def measure_budget(engine, max_batch_tokens: int, min_batch_tokens: int,
                   memory_share: float = 1.0) -> BatchBudget:
    """The batch budget of `engine` (gpu_worker/forward/engine.py::Engine) and the probe's rate. On
    the CPU: `max_batch_tokens`, and the rate of a probe batch of the bench shape (cpu_rate). On a
    GPU a multi-item probe batch measures activation memory per token:

        budget = MEMORY_FRACTION * memory_share * free_memory_after_weights / peak_bytes_per_token

    capped by `max_batch_tokens` (the YAML's cap) when that is set (> 0); it must hold
    `min_batch_tokens` (the longest sequence the ingress may send). `memory_share`: this
    engine's part where several share the replica (AppConfig.memory_share). Free memory counts
    what the process's allocator holds cached, which is every engine's to reuse; a probe that
    runs beside another engine's batches also sees their peak, so it measures high per token
    and the budget comes out lower, never higher."""
    if engine.device.type != "cuda":
        return BatchBudget(max_batch_tokens, cpu_rate(engine, max_batch_tokens, min_batch_tokens))
    batch = list(_multi_item_batch(PROBE_TOKENS, PROBE_TOKENS))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    _run(engine, batch, use_cache=False)
    per_token = (torch.cuda.max_memory_allocated() - base) / PROBE_TOKENS
    started = time.perf_counter()  # the same batch again, compiled: its rate
    _run(engine, batch, use_cache=False)
    capacity = PROBE_TOKENS / (time.perf_counter() - started)
    free, _ = torch.cuda.mem_get_info()
    budget = int(MEMORY_FRACTION * memory_share * (free + torch.cuda.memory_reserved() - base)
                 / per_token)
    if max_batch_tokens > 0:
        budget = min(budget, max_batch_tokens)
    if budget < min_batch_tokens:
        # A sequence the ingress accepts always runs, alone if need be: it must fit.
        raise RuntimeError(f"GPU memory fits batches of {budget} tokens, fewer than "
                           f"max_seq_tokens={min_batch_tokens}: lower max_seq_tokens (or "
                           "engine.prefix_cache.tokens)")
    logger.info("warm-up done: %.0f activation bytes per token; batch budget %d tokens; "
                "%.0f tokens/s", per_token, budget, capacity)
    return BatchBudget(budget, capacity)


def cpu_rate(engine, budget_tokens: int, max_seq_tokens: int) -> float:
    """Tokens per second of a CPU engine on a batch of the bench shape (CPU_PROBE_TOKENS, or the
    budget if smaller), after a small batch has run once (a first forward allocates)."""
    _run(engine, [pack_plain([7] * 64, 0)], use_cache=False)
    tokens = min(budget_tokens, CPU_PROBE_TOKENS)
    batch = list(_multi_item_batch(tokens, max_seq_tokens))
    started = time.perf_counter()
    _run(engine, batch, use_cache=False)
    rate = tokens / (time.perf_counter() - started)
    logger.info("CPU probe: %d tokens at %.0f tokens/s", tokens, rate)
    return rate


def warm_up(engine, budget_tokens: int, max_seq_tokens: int) -> None:
    """Run every kernel variant a batch can need once, eagerly (a batch too large for a CUDA
    graph runs so), so that nothing compiles on the request path. GPU only."""
    if engine.device.type != "cuda":
        return
    started, compiled = time.perf_counter(), triton_variants()
    for batch in warm_up_batches(budget_tokens, max_seq_tokens):
        _run(engine, batch, eager=True, use_cache=False)
    loaded = [slot for slot, adapter in enumerate(engine.adapters, 1) if adapter]
    if loaded:  # one adapter's run, then several: on Hopper the LoRA kernels either way
        # (gpu_worker/kernels/lora.py), elsewhere slices (widened GEMMs: every slot one width)
        batch = warm_up_batches(budget_tokens, max_seq_tokens)[0]
        _run(engine, batch, eager=True, use_cache=False,
             adapters=[loaded[0]] * len(batch))
        mixed = [0, *loaded]
        _run(engine, batch, eager=True, use_cache=False,
             adapters=[mixed[k % len(mixed)] for k in range(len(batch))])
    cache = engine.prefix_cache
    if cache is not None:  # then emptied: warm-up never counts as a hit
        for batch in cached_warm_up_batches(budget_tokens, max_seq_tokens, cache.min_tokens,
                                            cache.min_share):
            _run(engine, batch, eager=True)
        cache.clear()
    logger.info("warm-up batches ran in %.1f s (%d Triton variants compiled)",
                time.perf_counter() - started, triton_variants() - compiled)


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


# The modules of gpu_worker/kernels/ whose variants triton_variants() counts (a name that is not a
# module there would count as none compiled: tests/cpu/test_warm_up_batches.py checks them).
WARMED_KERNELS = ("add_norm", "fp8_quant", "gate_up_silu", "lora", "qkv")


def triton_variants() -> int:
    """Triton kernels compiled in this process so far, over every specialization of this
    package's kernels (Triton keeps one cache entry per variant)."""
    count = 0
    for name in WARMED_KERNELS:
        module = sys.modules.get(f"gpu_worker.kernels.{name}")
        for value in vars(module).values() if module else ():
            for cache in getattr(value, "device_caches", {}).values():
                count += len(cache[0])
    return count
