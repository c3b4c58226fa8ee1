"""Device work for one batch: launch() queues the forward, finish() waits and reads the results.

The engine takes plain packed sequences and their label ids and knows nothing of tasks,
callbacks, cancellation or clocks: those are the scheduler's (docs/ARCHITECTURE.md, "The
scheduler"). All metadata comes from the ingress's Python ints. On CUDA the host tensors are
fresh pinned tensors copied with non_blocking=True and only the label log-probs come back, into a
pinned buffer, after `done` is recorded; finish() is the only place that waits on the device.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gpu_worker.attention.flashinfer import FlashInferAttention
from gpu_worker.attention.prefix_cache import CachePlan, InsertingAttention, PrefixCache
from gpu_worker.attention.sdpa import TorchAttention
from gpu_worker.forward.batch import ForwardBatch, LoraRows, lora_runs, lora_slot_lists
from gpu_worker.forward.graphs import CudaGraphs
from gpu_worker.forward.host_tensors import padded_int64_tensor
from gpu_worker.forward.startup import check_pool_fits
from gpu_worker.model.decoder import AttentionBackend, CausalLMForScoring, Linear
from gpu_worker.model.fp8 import check_fp8_device, quantize_model
from gpu_worker.model.heads import AdapterHeads, SequenceClassifierForScoring
from gpu_worker.model.loader import load_model
from gpu_worker.model.lora import Adapter, lora_linears
from gpu_worker.model.ops import CudaOps, TorchOps
from gpu_worker.serving.scheduler import BatchAbandoned
from ranker_contract.config import EngineConfig, LoraConfig
from ranker_contract.model_config import ModelFolderError
from ranker_contract.packing import PackedSequence

# Where scores are deterministic (docs/ARCHITECTURE.md, "Deterministic scores"). On CUDA, linears
# of fewer rows run padded to this many: from here cuBLAS bf16 sums every row count the same way
# on the decoder's shapes (its LM head at any count).
CUDA_MIN_ROWS = 256
# On the CPU a linear whose input is wider than its output (K > N: the down projection), where
# MKL splits the K sum between threads by the row count, runs in chunks of exactly this many
# rows; the others, whose rows MKL sums the same way from 16 rows up, run padded to that many
# (gpu_worker/model/decoder.py::Linear; measured on Intel and AMD, and the cost of chunking every
# linear: docs/BENCHMARKS.md, "Deterministic scores on the CPU").
CPU_CHUNK_ROWS, CPU_MIN_ROWS = 128, 16


@dataclass(slots=True)
class Step:
    """A launched batch. NOTE: owns every host and device tensor of the batch until finished,
    so no pinned source is freed (and reused) while its copy may still be running."""

    keep_alive: tuple[object, ...]  # tensors, and the ForwardBatch that holds the rest
    out_cpu: torch.Tensor  # [N] fp32 label log-probs, flat in sequence/item/label order
    done: torch.cuda.Event | None  # None on CPU: the work already ran
    items_and_labels: list[tuple[int, int]]  # per sequence: how finish() splits out_cpu


@dataclass(slots=True)
class BatchPlan:
    """One batch as it will run, decided on the host before anything is queued: on a captured
    graph or eagerly, and with the prefix cache's plan (its readers without their cached query
    rows)."""

    sequences: list[PackedSequence]
    label_ids: list[list[int]]
    items_and_labels: list[tuple[int, int]]
    graph: object | None = None  # a captured graph of gpu_worker/forward/graphs.py, or eager
    cache: CachePlan | None = None
    adapters: list[int] | None = None  # per sequence, its adapter slot (0: the base); None: all 0


class Engine:
    """`reference`: TorchOps and TorchAttention on any device, HF's order of operations (the GPU
    tests' reference); otherwise the device decides (docs/ARCHITECTURE.md, "Engine")."""

    def __init__(self, model: CausalLMForScoring, device: torch.device,
                 cfg: EngineConfig | None = None, *, reference: bool = False,
                 lora: LoraConfig | None = None) -> None:
        """`lora`: adapter slots to allocate (put_adapter fills them); None: the model alone."""
        cfg = cfg or EngineConfig()
        fused = device.type == "cuda" and not reference
        if cfg.cuda_graphs.enabled and not fused:
            raise ValueError("CUDA graphs need the fused kernels (device cuda, not reference)")
        self.model = model
        self.device = device
        self.asynchronous = device.type == "cuda"  # gpu_worker/serving/scheduler.py::BatchEngine
        self.vocab_size = model.config.vocab_size
        self.dtype = model.model.embed_tokens.weight.dtype  # any head
        mcfg = model.config
        self.ops = CudaOps(mcfg, device) if fused else TorchOps(mcfg)
        # Allocated, like the graphs, before the batch budget is measured, so the budget is what
        # memory the pool leaves.
        self.prefix_cache = None
        if cfg.prefix_cache.enabled:
            pc = cfg.prefix_cache
            check_pool_fits(pc.tokens, PrefixCache.bytes_per_token(mcfg, self.dtype), device)
            self.prefix_cache = PrefixCache(mcfg, pc.tokens, pc.min_tokens, pc.min_query_share,
                                            pc.page_tokens, self.dtype, device)
        pool = self.prefix_cache.kv if self.prefix_cache else None
        self.attention: AttentionBackend = (
            FlashInferAttention(mcfg, device, pool, split_kv=not cfg.deterministic) if fused
            else TorchAttention(device, pool))
        # Adapters: slot k + 1 holds adapters[k] (None: empty). The slots are allocated before
        # the graphs, which read them, and before the batch budget is measured.
        self.adapters: list[Adapter | None] = []
        self._adapter_keys: list[bytes] = []  # per slot: whose K/V the prefix cache keeps
        self._loads = 0
        self._lora_linears: dict = {}  # (layer, packed linear name) -> its LoraLinear
        self.max_rank = 0
        if lora is not None:
            # the Triton kernels (gpu_worker/kernels/lora.py) where the fused gate/up kernel
            # runs (its tiles, Hopper); elsewhere LoraLinear's slice path only
            self._lora_linears = lora_linears(model, lora.slots, lora.max_rank,
                                              self.ops.fused_gate_up)
            self.adapters = [None] * lora.slots
            if isinstance(model, SequenceClassifierForScoring):  # adapters may bring heads
                model.adapter_heads = AdapterHeads(model.score.weight, lora.slots)
            self._adapter_keys = [b""] * lora.slots
            self.max_rank = lora.max_rank
        # every batch with an adapter through the kernels (LoraRows.kernels), or none
        self._lora_kernels = any(x.kernels for x in self._lora_linears.values())
        # LoRA graphs need every linear on the kernels: a graph's rows name their slots
        lora_graphs = self._lora_kernels and all(x.kernels for x in self._lora_linears.values())
        if cfg.deterministic and (fused or device.type == "cpu"):
            # docs/ARCHITECTURE.md, "Deterministic scores"; after the LoRA linears replaced
            # theirs. On CUDA not the LM head: 256 rows of it would cost a lone request.
            for module in (model.model if fused else model).modules():
                if isinstance(module, Linear) and fused:
                    module.min_rows = CUDA_MIN_ROWS
                elif isinstance(module, Linear):
                    module.min_rows = CPU_MIN_ROWS
                    if module.in_features > module.out_features:
                        module.chunk_rows = CPU_CHUNK_ROWS
        self.graphs = (CudaGraphs(model, self.ops, list(cfg.cuda_graphs.token_buckets),
                                  self.dtype, device, lora_graphs)
                       if cfg.cuda_graphs.enabled else None)

    def put_adapter(self, slot: int, adapter: Adapter) -> None:
        """Load a LoRA adapter (gpu_worker/model/lora.py) into `slot` (1 up to the configured slots;
        0 is the model alone), over the adapter it held. Queued on the device after every batch
        launched before: the caller must launch no batch naming the old adapter after this."""
        if not 1 <= slot <= len(self.adapters):
            raise ValueError(f"adapter slot {slot}: this engine has {len(self.adapters)} slots")
        self.check_adapter(adapter)
        for key, linear in self._lora_linears.items():
            linear.put(slot, adapter.pairs.get(key))
        if isinstance(self.model, SequenceClassifierForScoring):
            self.model.adapter_heads.put(slot, adapter.head)
        self.adapters[slot - 1] = adapter
        # A new key on every load: the prefix cache never serves K/V of what the slot held
        # before, nor of an earlier read of this folder (its files may have changed since).
        self._loads += 1
        self._adapter_keys[slot - 1] = self._loads.to_bytes(8, "little")

    def check_adapter(self, adapter: Adapter) -> None:
        """Raise ModelFolderError where this engine's slots cannot hold the adapter (its own
        classification head was checked against the model's config as it was read)."""
        if adapter.rank > self.max_rank:
            raise ModelFolderError(f"{adapter.folder}: rank {adapter.rank} is above "
                                   f"lora.max_rank {self.max_rank}")

    def add_adapter(self, adapter: Adapter) -> int:
        """Load an adapter into the first empty slot; returns the slot."""
        if None not in self.adapters:
            raise ValueError(f"all {len(self.adapters)} adapter slots are full")
        slot = self.adapters.index(None) + 1
        self.put_adapter(slot, adapter)
        return slot

    @classmethod
    def from_config(cls, model_path: str | Path, cfg: EngineConfig,
                    head_from_labels: tuple[int, int] | None = None,
                    lora: LoraConfig | None = None) -> Engine:
        """Load the model folder onto the configured device, each linear in the configured
        precision (`head_from_labels`: see gpu_worker/model/loader.py::load_model; `lora`: adapter
        slots)."""
        if cfg.device == "cpu":
            torch.set_num_threads(cfg.torch_threads or os.cpu_count() or 1)
        elif not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was configured but torch sees no CUDA device")
        device = torch.device(cfg.device)
        if cfg.precision == "fp8":
            check_fp8_device(device)
        model = load_model(model_path, getattr(torch, cfg.dtype), device, cfg.precision,
                           cfg.fp8.dequantize_checkpoint, head_from_labels)
        if cfg.precision == "fp8":  # each linear's precision, fixed before anything runs
            quantize_model(model, cfg.fp8)
        return cls(model, device, cfg, lora=lora)

    def launch(self, sequences: list[PackedSequence], label_ids_per_sequence: list[list[int]],
               *, eager: bool = False, use_cache: bool = True,
               adapters: list[int] | None = None, cache_owners: list[str] | None = None,
               abandoned: Callable[[], bool] | None = None) -> Step:
        """Queue the batch's forward; each sequence is scored on its own label ids. A batch
        that fits a captured CUDA graph replays it, busy or idle (docs/ARCHITECTURE.md, "CUDA
        graphs"); `eager`: never (start-up probes, and tests comparing the two).
        `use_cache`: False for start-up probes, which must neither fill nor hit the prefix cache.
        `adapters`: per sequence, the slot of its LoRA adapter (put_adapter; 0 the base); a batch
        with any runs eagerly unless the graphs were captured with LoRA (on Hopper). The prefix
        cache keeps an adapter's K/V apart from the base's and every other adapter's, and each
        of `cache_owners` (per sequence, its tenant: ScoreJob.cache_owner) apart from the others'.
        `abandoned`: on the CPU, asked before each layer; True stops the batch with
        BatchAbandoned (gpu_worker/serving/scheduler.py). A CUDA forward is only queued here."""
        with_lora = adapters is not None and any(adapters)
        if with_lora and any(slot and (slot > len(self.adapters) or self.adapters[slot - 1]
                                       is None) for slot in adapters):
            raise ValueError(f"adapter slots {sorted(set(adapters))}: this engine holds "
                             f"adapters in {[k + 1 for k, a in enumerate(self.adapters) if a]}")
        eager = eager or (with_lora and not (self.graphs is not None and self.graphs.lora))
        plan = self.plan(sequences, label_ids_per_sequence, eager, use_cache,
                         adapters if with_lora else None, cache_owners)
        if plan.graph is not None:
            return self._replay(plan)
        return self._run_eager(plan, None if self.asynchronous else abandoned)

    def plan(self, sequences: list[PackedSequence], label_ids_per_sequence: list[list[int]],
             eager: bool = False, use_cache: bool = True,
             adapters: list[int] | None = None,
             cache_owners: list[str] | None = None) -> BatchPlan:
        """Host work only. A batch with a query the prefix cache may keep runs eagerly through
        the cache, idle or not: a graph cannot read or fill it, and a query left out when idle is
        a miss when it returns (docs/ARCHITECTURE.md, "Prefix cache")."""
        items_and_labels = [(s.num_items, len(ids))
                            for s, ids in zip(sequences, label_ids_per_sequence)]
        plan = BatchPlan(sequences, label_ids_per_sequence, items_and_labels,
                         adapters=adapters)
        cache = self.prefix_cache if use_cache else None
        if cache is not None and any(cache.may_keep(s) for s in sequences):
            plan.cache = cache.plan(sequences, self._owners(adapters, cache_owners))
            plan.sequences = plan.cache.sequences  # readers without their cached query rows
        elif self.graphs is not None and not eager:
            plan.graph = self.graphs.pick(sequences, sum(n for n, _ in items_and_labels),
                                          sum(n * labels for n, labels in items_and_labels))
        return plan

    def _owners(self, adapters: list[int] | None, tenants: list[str] | None
                ) -> list[bytes] | None:
        """Per sequence, whose K/V the prefix cache keeps: its adapter's load key (b"" for the
        model alone), then its tenant's name where it has one, the key padded to its 8 bytes
        so that no adapter and tenant pair reads as another."""
        if not adapters and not tenants:
            return None
        n = len(adapters or tenants)
        owners = []
        for slot, tenant in zip(adapters or [0] * n, tenants or [""] * n, strict=True):
            key = self._adapter_keys[slot - 1] if slot else b""
            owners.append(key.ljust(8, b"\0") + tenant.encode() if tenant else key)
        return owners

    def _replay(self, plan: BatchPlan) -> Step:
        out, keep = self.graphs.launch(plan.graph, plan.sequences,
                                       *_host_metadata(plan.sequences, plan.label_ids),
                                       lora_slots=(lora_slot_lists(plan.sequences, plan.adapters)
                                                   if plan.adapters else None))
        return self._read_back(out, keep, plan.items_and_labels)

    def _run_eager(self, plan: BatchPlan, abandoned: Callable[[], bool] | None) -> Step:
        batch, host = self._forward_batch(plan)
        if abandoned is not None:
            def stop_if_abandoned() -> None:
                if abandoned():
                    raise BatchAbandoned("stopped part-way: nobody waits for the batch")

            batch.stop_if_abandoned = stop_if_abandoned
        try:
            with torch.inference_mode():
                out = self.model(batch, self.ops)
        except BaseException:
            if plan.cache is not None:  # its new entries were never filled: no later batch may hit
                self.prefix_cache.forget(plan.cache)
            raise
        if self.device.type != "cuda":
            return Step((host, batch), out, None, plan.items_and_labels)
        return self._read_back(out, (host, batch), plan.items_and_labels)

    def _forward_batch(self, plan: BatchPlan) -> tuple[ForwardBatch, torch.Tensor]:
        """The batch's ForwardBatch (its inputs queued to the device in one copy, its attention
        planned) and the host tensor of that copy, which must stay alive until it finished."""
        cache = plan.cache
        input_ids, positions, score_rows, label_rows, label_ids = _host_metadata(
            plan.sequences, plan.label_ids)
        kernel_slots = plan.adapters is not None and self._lora_kernels
        # [T], [T], [R], [N], [N], then the rows and slots the cache inserts (empty without),
        # then each token's and each score row's adapter slot for the LoRA kernels (else empty)
        lists = (input_ids, positions, score_rows, label_rows, label_ids,
                 *((cache.insert_rows, cache.insert_slots) if cache else ([], [])),
                 *(lora_slot_lists(plan.sequences, plan.adapters) if kernel_slots
                   else ([], [])))
        sizes = [len(x) for x in lists]
        host = padded_int64_tensor(list(zip(lists, sizes)),  # one copy for all
                                   pin=self.device.type == "cuda")
        dev = host.to(self.device, non_blocking=True)
        (ids, pos, rows, label_rows_dev, label_ids_dev, insert_rows, insert_slots,
         token_slots, row_slots) = dev.split(sizes)
        attention = self.attention.plan(plan.sequences, self.dtype,
                                        cache.cached_slots if cache else None)
        if cache and cache.insert_rows:
            attention = InsertingAttention(attention, self.prefix_cache.kv, insert_rows,
                                           insert_slots)
        lora = None
        if plan.adapters is not None:  # the LoRA path, decided here for the whole batch
            lora = LoraRows(*lora_runs(plan.sequences, plan.adapters),
                            kernels=self._lora_kernels, token_slots=token_slots,
                            row_slots=row_slots)
        return ForwardBatch(ids, pos, rows, label_rows_dev, label_ids_dev, attention,
                            lora), host

    @staticmethod
    def _read_back(out: torch.Tensor, keep: tuple[torch.Tensor, ...],
                   items_and_labels: list[tuple[int, int]]) -> Step:
        """Queue the copy of the [N] log-probs into pinned memory and mark the batch's end."""
        out_cpu = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)  # [N] fp32
        out_cpu.copy_(out, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return Step((*keep, out), out_cpu, done, items_and_labels)

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
        return results


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
