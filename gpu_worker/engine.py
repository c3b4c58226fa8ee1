"""Device work for one batch: launch() queues the forward, finish() waits and reads the results.

All metadata comes from the ingress's Python ints. On CUDA the host tensors are fresh pinned
tensors copied with non_blocking=True and only the label log-probs come back, into a pinned
buffer, after `done` is recorded; finish() is the only place that waits on the device.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from gpu_worker.attention_flashinfer import FlashInferAttention
from gpu_worker.attention_torch import TorchAttention
from gpu_worker.model import CausalLMForScoring
from gpu_worker.ops import CudaOps, TorchOps
from serve_app.packing import PackedSequence

logger = logging.getLogger(__name__)

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
    def __init__(
        self,
        model: CausalLMForScoring,
        device: torch.device,
        attention: str = "torch",  # "torch" (SDPA + explicit mask) or "flashinfer"
        ops: str = "torch",  # "torch" or "cuda" (fused FlashInfer + Triton kernels)
        flashinfer_backend: str = "fa2",
        fp32_residual: bool = True,  # with ops="cuda": keep the residual stream in fp32
    ) -> None:
        self.model = model
        self.device = device
        self.vocab_size = model.config.vocab_size
        self.dtype = model.lm_head.weight.dtype
        cfg = model.config
        self.ops = CudaOps(cfg, device, fp32_residual) if ops == "cuda" else TorchOps(cfg)
        # Benchmarks set a list here to collect (start, done) CUDA events per step.
        self.step_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] | None = None
        self.flashinfer_attention = (
            FlashInferAttention(cfg, device, flashinfer_backend)
            if attention == "flashinfer" else None
        )

    def launch(self, tasks: list[ScoreTask]) -> Step:
        started = None
        if self.step_events is not None:  # recorded first: host preparation counts as step time
            started = torch.cuda.Event(enable_timing=True)
            started.record()
        sequences = [t.sequence for t in tasks]
        input_ids, positions, score_rows, label_rows, label_ids = _host_metadata(tasks)
        on_cuda = self.device.type == "cuda"
        host = [
            torch.tensor(x, dtype=torch.int64, pin_memory=on_cuda)  # [T], [T], [R], [N], [N]
            for x in (input_ids, positions, score_rows, label_rows, label_ids)
        ]
        dev = [h.to(self.device, non_blocking=True) for h in host]
        if self.flashinfer_attention is not None:
            attend, plan_tensors = self.flashinfer_attention, self.flashinfer_attention.plan(
                sequences, self.dtype)
        else:
            attend, plan_tensors = TorchAttention(sequences, self.device), ()
        with torch.inference_mode():
            hidden = self.model.model(dev[0], dev[1], dev[2], self.ops, attend)
            out = self.model.label_logprobs(hidden, dev[3], dev[4])
        if not on_cuda:
            return Step(tasks, tuple(host), out, None)
        out_cpu = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)  # [N] fp32
        out_cpu.copy_(out, non_blocking=True)
        done = torch.cuda.Event(enable_timing=started is not None)
        done.record()
        if started is not None:
            self.step_events.append((started, done))
        return Step(tasks, (*host, *dev, *plan_tensors, out), out_cpu, done)

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
