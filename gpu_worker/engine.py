"""Device work for one batch: launch() queues the forward, finish() waits and reads the results.

The engine takes plain packed sequences and their label ids and knows nothing of tasks,
callbacks, cancellation or clocks: those are the scheduler's (docs/ARCHITECTURE.md, "The
scheduler"). All metadata comes from the ingress's Python ints. On CUDA the host tensors are
fresh pinned tensors copied with non_blocking=True and only the label log-probs come back, into a
pinned buffer, after `done` is recorded; finish() is the only place that waits on the device.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gpu_worker.attention_flashinfer import FlashInferAttention
from gpu_worker.attention_torch import TorchAttention
from gpu_worker.fp8 import Fp8Setting, check_fp8_device, quantize_model
from gpu_worker.graphs import CudaGraphs
from gpu_worker.host_tensors import padded_int64_tensor
from gpu_worker.loader import load_model
from gpu_worker.model import AttentionBackend, CausalLMForScoring
from gpu_worker.ops import CudaOps, TorchOps
from gpu_worker.prefix_cache import InsertingAttention, PrefixCache
from gpu_worker.warmup import cached_warm_up_batches, triton_variants, warm_up_batches
from ranker_contract.config import EngineConfig
from ranker_contract.packing import PackedSequence, pack_multi_item

logger = logging.getLogger(__name__)

# Share of free GPU memory (after weights) that batch activations may use.
MEMORY_FRACTION = 0.8
PROBE_TOKENS = 8192  # about one bench-sized batch slice; activations scale linearly
# Label ids of the probe and warm-up batches: 0 exists in a vocabulary and in a one-class head.
PROBE_LABEL_IDS = [0, 0]


@dataclass(frozen=True, slots=True)
class BatchBudget:
    """What the warm-up probe measured (Engine.measure_budget)."""

    tokens: int  # tokens one batch may hold: the scheduler's batch_token_budget
    # Tokens per second of the probe batch (~8k tokens, eager; 0.0 on CPU: not measured): what
    # the autoscaler compares the computed rate with. Batches under load are larger and faster
    # per token, so the share it gives reads somewhat high.
    capacity_tokens_per_s: float


@dataclass(slots=True)
class Step:
    """A launched batch. NOTE: owns every host and device tensor of the batch until finished,
    so no pinned source is freed (and reused) while its copy may still be running."""

    keep_alive: tuple[torch.Tensor, ...]
    out_cpu: torch.Tensor  # [N] fp32 label log-probs, flat in sequence/item/label order
    done: torch.cuda.Event | None  # None on CPU: the work already ran
    items_and_labels: list[tuple[int, int]]  # per sequence: how finish() splits out_cpu
    # The index in the batch as launched of each sequence as run (the prefix cache runs those
    # that read it first); None: as launched.
    order: list[int] | None = None


class Engine:
    def __init__(self, model: CausalLMForScoring, device: torch.device,
                 cfg: EngineConfig | None = None) -> None:
        cfg = cfg or EngineConfig()
        if cfg.precision == "fp8":  # before any graph captures the forward
            check_fp8_device(device)
            quantize_model(model, Fp8Setting(cfg.fp8_linears, cfg.fp8_bf16_first_layers,
                                             cfg.fp8_bf16_last_layers))
        self.model = model
        self.device = device
        self.vocab_size = model.config.vocab_size
        self.dtype = model.model.embed_tokens.weight.dtype  # any head
        mcfg = model.config
        self.ops = (CudaOps(mcfg, device, cfg.fp32_residual, cfg.fused_gate_up)
                    if cfg.ops == "cuda" else TorchOps(mcfg))
        self.attention: AttentionBackend
        if cfg.attention == "flashinfer":
            self.attention = FlashInferAttention(mcfg, device, cfg.flashinfer_backend)
        else:
            self.attention = TorchAttention(device)
        # Allocated, like the graphs, before the batch budget is measured, so the budget is what
        # memory the pool leaves.
        self.prefix_cache = (_prefix_cache(mcfg, cfg, self.dtype, device)
                             if cfg.prefix_cache_tokens else None)
        # Captured before the batch budget is measured, so their memory is counted there.
        self.graphs = (CudaGraphs(model, self.ops, list(cfg.cuda_graph_buckets),
                                  cfg.flashinfer_backend, device) if cfg.cuda_graphs else None)

    @classmethod
    def from_config(cls, model_path: str | Path, cfg: EngineConfig,
                    head_from_labels: tuple[int, int] | None = None) -> Engine:
        """Load the model folder onto the configured device (`head_from_labels`: see
        gpu_worker/loader.py::load_model)."""
        if cfg.device == "cpu":
            torch.set_num_threads(cfg.torch_threads or os.cpu_count() or 1)
        elif not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was configured but torch sees no CUDA device")
        device = torch.device(cfg.device)
        model = load_model(model_path, getattr(torch, cfg.dtype), device, cfg.precision,
                           cfg.dequantize_fp8_checkpoint, head_from_labels)
        return cls(model, device, cfg)

    def measure_budget(self, max_batch_tokens: int, min_batch_tokens: int) -> BatchBudget:
        """The batch budget and the probe's rate. On CPU: `max_batch_tokens`, no rate. On a GPU a
        multi-item probe batch measures activation memory per token (warm_up then runs every
        kernel variant at the budget):

            budget = MEMORY_FRACTION * free_memory_after_weights / peak_bytes_per_token

        capped by `max_batch_tokens` (the YAML's cap) when that is set (> 0); it must hold
        `min_batch_tokens` (the longest sequence the ingress may send).
        """
        if self.device.type != "cuda":
            return BatchBudget(max_batch_tokens, 0.0)
        items = [list(range(200, 380))] * (PROBE_TOKENS // 181 - 1)  # ~PROBE_TOKENS in all
        sequences, label_ids = [pack_multi_item(list(range(1, 121)), items, 0)], [PROBE_LABEL_IDS]
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        self.finish(self.launch(sequences, label_ids, use_cache=False))
        tokens = sum(s.num_tokens for s in sequences)
        per_token = (torch.cuda.max_memory_allocated() - base) / tokens
        started = time.perf_counter()  # the same batch again, compiled: its rate
        self.finish(self.launch(sequences, label_ids, use_cache=False))
        capacity = tokens / (time.perf_counter() - started)
        free, _ = torch.cuda.mem_get_info()
        budget = int(MEMORY_FRACTION * (free + torch.cuda.memory_reserved() - base) / per_token)
        if max_batch_tokens > 0:
            budget = min(budget, max_batch_tokens)
        if budget < min_batch_tokens:
            # A sequence the ingress accepts always runs, alone if need be: it must fit.
            raise RuntimeError(f"GPU memory fits batches of {budget} tokens, fewer than "
                               f"max_seq_tokens={min_batch_tokens}: lower max_seq_tokens (or "
                               "engine.prefix_cache_tokens)")
        logger.info("warm-up done: %.0f activation bytes per token; batch budget %d tokens; "
                    "%.0f tokens/s", per_token, budget, capacity)
        return BatchBudget(budget, capacity)

    def warm_up(self, budget_tokens: int, max_seq_tokens: int) -> None:
        """Run every kernel variant a batch can need once, eagerly as under load, so that nothing
        compiles on the request path (gpu_worker/warmup.py). GPU only."""
        if self.device.type != "cuda":
            return
        started, compiled = time.perf_counter(), triton_variants()
        for batch in warm_up_batches(budget_tokens, max_seq_tokens):
            self.finish(self.launch(batch, [PROBE_LABEL_IDS] * len(batch), overlapped=True,
                                    use_cache=False))
        if self.prefix_cache is not None:  # then emptied: warm-up never counts as a hit
            for batch in cached_warm_up_batches(budget_tokens, max_seq_tokens,
                                                self.prefix_cache.min_tokens,
                                                self.prefix_cache.min_share):
                self.finish(self.launch(batch, [PROBE_LABEL_IDS] * len(batch), overlapped=True))
            self.prefix_cache.clear()
        logger.info("warm-up batches ran in %.1f s (%d Triton variants compiled)",
                    time.perf_counter() - started, triton_variants() - compiled)

    def launch(self, sequences: list[PackedSequence], label_ids_per_sequence: list[list[int]],
               *, overlapped: bool = False, use_cache: bool = True) -> Step:
        """Queue the batch's forward; each sequence is scored on its own label ids.
        `overlapped`: another batch is still running on the device, so these ~300 eager launches
        hide behind it; a CUDA graph pays only when they would not (its fixed tiles and padding
        cost more GPU time than the eager kernels; docs/ARCHITECTURE.md, "CUDA graphs").
        `use_cache`: False for start-up probes, which must neither fill nor hit the prefix cache.
        A batch with a query the prefix cache may keep runs eagerly through the cache, idle or
        not: a graph cannot read or fill it, and a query left out when idle is a miss when it
        returns (docs/ARCHITECTURE.md, "Prefix cache")."""
        items_and_labels = [(s.num_items, len(ids))
                            for s, ids in zip(sequences, label_ids_per_sequence)]
        use_cache = use_cache and self.prefix_cache is not None
        graph = (not overlapped and self.graphs
                 and not (use_cache and any(self.prefix_cache.may_keep(s) for s in sequences))
                 and self.graphs.pick(sequences, sum(n for n, _ in items_and_labels),
                                      sum(n * labels for n, labels in items_and_labels)))
        if graph:
            out, keep = self.graphs.launch(graph, sequences, *_host_metadata(
                sequences, label_ids_per_sequence))
            return self._read_back(out, keep, items_and_labels)
        cache = self.prefix_cache.plan(sequences) if use_cache else None
        if cache is not None:  # without their cached query rows, the pool's readers first
            sequences = cache.sequences
            label_ids_per_sequence = [label_ids_per_sequence[i] for i in cache.order]
            items_and_labels = [items_and_labels[i] for i in cache.order]
        input_ids, positions, score_rows, label_rows, label_ids = _host_metadata(
            sequences, label_ids_per_sequence)
        on_cuda = self.device.type == "cuda"
        # [T], [T], [R], [N], [N], then the rows and slots the cache inserts (empty without)
        lists = (input_ids, positions, score_rows, label_rows, label_ids,
                 *((cache.insert_rows, cache.insert_slots) if cache else ([], [])))
        sizes = [len(x) for x in lists]
        host = padded_int64_tensor(list(zip(lists, sizes)), pin=on_cuda)  # one copy for all
        dev = host.to(self.device, non_blocking=True)
        ids, pos, rows, label_rows_dev, label_ids_dev, insert_rows, insert_slots = dev.split(sizes)
        plan_tensors = self.attention.plan(
            sequences, self.dtype, *((self.prefix_cache.kv, cache.cached_slots) if cache else ()))
        attend = (InsertingAttention(self.attention, self.prefix_cache.kv, insert_rows,
                                     insert_slots) if cache and cache.insert_rows
                  else self.attention)
        try:
            with torch.inference_mode():
                hidden = self.model.model(ids, pos, rows, self.ops, attend)
                out = self.model.label_logprobs(hidden, label_rows_dev, label_ids_dev)
        except BaseException:
            if cache is not None:  # its new entries were never filled: no later batch may hit
                self.prefix_cache.forget(cache)
            raise
        order = cache.order if cache is not None else None
        if not on_cuda:
            return Step((host, *plan_tensors), out, None, items_and_labels, order)
        return self._read_back(out, (host, dev, *plan_tensors), items_and_labels, order)

    @staticmethod
    def _read_back(out: torch.Tensor, keep: tuple[torch.Tensor, ...],
                   items_and_labels: list[tuple[int, int]], order: list[int] | None = None
                   ) -> Step:
        """Queue the copy of the [N] log-probs into pinned memory and mark the batch's end."""
        out_cpu = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)  # [N] fp32
        out_cpu.copy_(out, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return Step((*keep, out), out_cpu, done, items_and_labels, order)

    def finish(self, step: Step) -> list[list[list[float]]]:
        """Per sequence: one row of label log-probs per item."""
        if step.done is not None:
            step.done.synchronize()
        flat = step.out_cpu.tolist()
        results, at = [], 0
        for n_items, n_labels in step.items_and_labels:
            rows = []
            for _ in range(n_items):
                rows.append(flat[at : at + n_labels])
                at += n_labels
            results.append(rows)
        if step.order is None:
            return results
        as_launched: list[list[list[float]]] = [[] for _ in results]
        for index, rows in zip(step.order, results):
            as_launched[index] = rows
        return as_launched


def _prefix_cache(mcfg, cfg: EngineConfig, dtype: torch.dtype,
                  device: torch.device) -> PrefixCache:
    need = cfg.prefix_cache_tokens * PrefixCache.bytes_per_token(mcfg, dtype)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if need > MEMORY_FRACTION * free:
            raise RuntimeError(
                f"engine.prefix_cache_tokens={cfg.prefix_cache_tokens} needs {need / 2**30:.1f} "
                f"GiB of K/V, more than {MEMORY_FRACTION:.0%} of the {free / 2**30:.1f} GiB free "
                "after the weights: lower it")
    logger.info("prefix cache: %d tokens, %.2f GiB", cfg.prefix_cache_tokens, need / 2**30)
    return PrefixCache(mcfg, cfg.prefix_cache_tokens, cfg.prefix_cache_min_tokens,
                       cfg.prefix_cache_min_query_share,
                       cfg.prefix_cache_page_tokens, dtype, device)


def _host_metadata(sequences: list[PackedSequence],
                   label_ids_per_sequence: list[list[int]]) -> tuple[list[int], ...]:
    input_ids: list[int] = []
    positions: list[int] = []
    score_rows: list[int] = []
    label_rows: list[int] = []
    label_ids: list[int] = []
    for seq, ids in zip(sequences, label_ids_per_sequence, strict=True):
        offset = len(input_ids)
        for row in seq.score_rows:
            label_rows.extend([len(score_rows)] * len(ids))
            label_ids.extend(ids)
            score_rows.append(offset + row)
        input_ids.extend(seq.input_ids)
        positions.extend(seq.positions)
    return input_ids, positions, score_rows, label_rows, label_ids
