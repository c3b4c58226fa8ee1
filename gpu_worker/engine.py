"""Device work for one batch: launch() queues the forward, finish() waits and reads the results.

All metadata comes from the ingress's Python ints. On CUDA the host tensors are fresh pinned
tensors copied with non_blocking=True and only the label log-probs come back, into a pinned
buffer, after `done` is recorded; finish() is the only place that waits on the device.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from gpu_worker.attention_flashinfer import FlashInferAttention
from gpu_worker.attention_torch import TorchAttention
from gpu_worker.graphs import CudaGraphs
from gpu_worker.host_tensors import padded_int64_tensor
from gpu_worker.loader import load_model
from gpu_worker.model import AttentionBackend, CausalLMForScoring
from gpu_worker.ops import CudaOps, TorchOps
from ranker_contract.config import EngineConfig
from ranker_contract.packing import PackedSequence, pack_multi_item

logger = logging.getLogger(__name__)

# Share of free GPU memory (after weights) that batch activations may use.
MEMORY_FRACTION = 0.8
PROBE_TOKENS = 8192  # about one bench-sized batch slice; activations scale linearly

# Receives a task's result (items × labels log-probs) or the exception that failed it.
DoneCallback = Callable[[list[list[float]] | BaseException], None]


@dataclass(slots=True)
class ScoreTask:
    """One packed sequence waiting to be scored, with its request's label ids."""

    sequence: PackedSequence
    label_ids: list[int]
    on_done: DoneCallback
    # True once nobody waits for the result (the caller went away): the loop drops the task.
    cancelled: Callable[[], bool] = lambda: False
    arrived: float = field(default_factory=time.monotonic)  # for the queue-wait bound
    launched: float = 0.0  # time.monotonic() when its batch was launched (set by the scheduler)

    @property
    def num_tokens(self) -> int:
        return self.sequence.num_tokens


@dataclass(slots=True)
class Step:
    """A launched batch. NOTE: owns every host and device tensor of the batch until finished,
    so no pinned source is freed (and reused) while its copy may still be running."""

    tasks: list[ScoreTask]
    keep_alive: tuple[torch.Tensor, ...]
    out_cpu: torch.Tensor  # [N] fp32 label log-probs, flat in task/item/label order
    done: torch.cuda.Event | None  # None on CPU: the work already ran


class Engine:
    def __init__(self, model: CausalLMForScoring, device: torch.device,
                 cfg: EngineConfig = EngineConfig()) -> None:
        self.model = model
        self.device = device
        self.vocab_size = model.config.vocab_size
        self.dtype = model.lm_head.weight.dtype
        mcfg = model.config
        self.ops = (CudaOps(mcfg, device, cfg.fp32_residual, cfg.fused_gate_up)
                    if cfg.ops == "cuda" else TorchOps(mcfg))
        self.attention: AttentionBackend
        if cfg.attention == "flashinfer":
            self.attention = FlashInferAttention(mcfg, device, cfg.flashinfer_backend)
        else:
            self.attention = TorchAttention(device)
        # Tokens per second of the warm-up probe batch (~8k tokens, eager; 0.0 on CPU: not
        # measured): what the autoscaler compares the computed rate with. Batches under load are
        # larger and faster per token, so the share it gives reads somewhat high.
        self.capacity_tokens_per_s = 0.0
        # Captured before the batch budget is measured, so their memory is counted there.
        self.graphs = (CudaGraphs(model, self.ops, list(cfg.cuda_graph_buckets),
                                  cfg.flashinfer_backend, device) if cfg.cuda_graphs else None)

    @classmethod
    def from_config(cls, model_path: str | Path, cfg: EngineConfig) -> Engine:
        """Load the model folder onto the configured device."""
        if cfg.device == "cpu":
            torch.set_num_threads(cfg.torch_threads or os.cpu_count() or 1)
        elif not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was configured but torch sees no CUDA device")
        device = torch.device(cfg.device)
        return cls(load_model(model_path, getattr(torch, cfg.dtype), device), device, cfg)

    def batch_token_budget(self, max_batch_tokens: int, min_batch_tokens: int) -> int:
        """Tokens one batch may hold. On CPU: `max_batch_tokens`. On a GPU a multi-item probe
        batch compiles every kernel before the replica reports ready and measures activation
        memory per token:

            budget = MEMORY_FRACTION * free_memory_after_weights / peak_bytes_per_token

        capped by `max_batch_tokens` when that is set (> 0); it must hold `min_batch_tokens` (the
        longest sequence the ingress may send).
        """
        if self.device.type != "cuda":
            return max_batch_tokens
        items = [list(range(200, 380))] * (PROBE_TOKENS // 181 - 1)  # ~PROBE_TOKENS in all
        tasks = [ScoreTask(pack_multi_item(list(range(1, 121)), items, 0), [1, 2],
                           lambda _: None)]
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        self.finish(self.launch(tasks))
        tokens = sum(t.num_tokens for t in tasks)
        per_token = (torch.cuda.max_memory_allocated() - base) / tokens
        started = time.perf_counter()  # the same batch again, compiled: its rate
        self.finish(self.launch(tasks))
        self.capacity_tokens_per_s = tokens / (time.perf_counter() - started)
        free, _ = torch.cuda.mem_get_info()
        budget = int(MEMORY_FRACTION * (free + torch.cuda.memory_reserved() - base) / per_token)
        if max_batch_tokens > 0:
            budget = min(budget, max_batch_tokens)
        if budget < min_batch_tokens:
            # A sequence the ingress accepts always runs, alone if need be: it must fit.
            raise RuntimeError(f"GPU memory fits batches of {budget} tokens, fewer than "
                               f"max_seq_tokens={min_batch_tokens}: lower max_seq_tokens")
        logger.info("warm-up done: %.0f activation bytes per token; batch budget %d tokens; "
                    "%.0f tokens/s", per_token, budget, self.capacity_tokens_per_s)
        return budget

    def launch(self, tasks: list[ScoreTask], *, overlapped: bool = False) -> Step:
        """Queue the batch's forward. `overlapped`: another batch is still running on the device,
        so these ~300 eager launches hide behind it; a CUDA graph pays only when they would not
        (its fixed tiles and padding cost more GPU time than the eager kernels)."""
        sequences = [t.sequence for t in tasks]
        input_ids, positions, score_rows, label_rows, label_ids = _host_metadata(tasks)
        graph = (not overlapped and self.graphs
                 and self.graphs.pick(sequences, len(score_rows), len(label_ids)))
        if graph:
            out, keep = self.graphs.launch(graph, sequences, input_ids, positions, score_rows,
                                           label_rows, label_ids)
            return self._read_back(tasks, out, keep)
        on_cuda = self.device.type == "cuda"
        lists = (input_ids, positions, score_rows, label_rows, label_ids)  # [T], [T], [R], [N], [N]
        sizes = [len(x) for x in lists]
        host = padded_int64_tensor(list(zip(lists, sizes)), pin=on_cuda)  # one copy for all
        dev = host.to(self.device, non_blocking=True)
        ids, pos, rows, label_rows_dev, label_ids_dev = dev.split(sizes)
        plan_tensors = self.attention.plan(sequences, self.dtype)
        with torch.inference_mode():
            hidden = self.model.model(ids, pos, rows, self.ops, self.attention)
            out = self.model.label_logprobs(hidden, label_rows_dev, label_ids_dev)
        if not on_cuda:
            return Step(tasks, (host, *plan_tensors), out, None)
        return self._read_back(tasks, out, (host, dev, *plan_tensors))

    @staticmethod
    def _read_back(tasks: list[ScoreTask], out: torch.Tensor,
                   keep: tuple[torch.Tensor, ...]) -> Step:
        """Queue the copy of the [N] log-probs into pinned memory and mark the batch's end."""
        out_cpu = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)  # [N] fp32
        out_cpu.copy_(out, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return Step(tasks, (*keep, out), out_cpu, done)

    def finish(self, step: Step) -> list[list[list[float]]]:
        """Per task: one row of label log-probs per item."""
        if step.done is not None:
            step.done.synchronize()
        flat = step.out_cpu.tolist()
        results, at = [], 0
        for task in step.tasks:
            n_labels = len(task.label_ids)
            rows = []
            for _ in range(task.sequence.num_items):
                rows.append(flat[at : at + n_labels])
                at += n_labels
            results.append(rows)
        return results


def _host_metadata(tasks: list[ScoreTask]) -> tuple[list[int], ...]:
    input_ids: list[int] = []
    positions: list[int] = []
    score_rows: list[int] = []
    label_rows: list[int] = []
    label_ids: list[int] = []
    for task in tasks:
        seq = task.sequence
        offset = len(input_ids)
        for row in seq.score_rows:
            label_rows.extend([len(score_rows)] * len(task.label_ids))
            label_ids.extend(task.label_ids)
            score_rows.append(offset + row)
        input_ids.extend(seq.input_ids)
        positions.extend(seq.positions)
    return input_ids, positions, score_rows, label_rows, label_ids
