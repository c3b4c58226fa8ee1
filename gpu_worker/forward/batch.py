"""One batch as the forward reads it (docs/ARCHITECTURE.md, "The forward batch").

The engine builds a ForwardBatch for every batch it runs eagerly and passes it explicitly
through the model; a CUDA graph is captured on one built over the graph's fixed input tensors,
which every replay rewrites (gpu_worker/forward/graphs.py). What differs from one batch to the next
is here and nowhere else: attention backends, LoRA linears and heads keep no state between batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ranker_contract.packing import PackedSequence

# (slot, start, end): consecutive rows [start, end) of one adapter
Run = tuple[int, int, int]


@dataclass(slots=True)
class LoraRows:
    """Which rows of a batch read which adapter, decided once when the batch is built.

    `token_runs` / `row_runs`: runs of consecutive tokens, and of score rows (what the last
    layer's o_proj and MLP read), of one adapter; a batch sorted by adapter (the scheduler sorts
    it) has one run per adapter, and base rows are in none. `kernels`: every LoRA linear whose
    shape the Triton kernels divide runs through gpu_worker/kernels/lora.py, reading each row's
    slot from `token_slots` / `row_slots` on the device (0: none); else each run is a slice (the
    CPU's path and the kernels' reference). `any_slot`: a CUDA graph being captured, whose rows
    may name any slot at replay, so every linear takes the kernels."""

    token_runs: list[Run] = field(default_factory=list)
    row_runs: list[Run] = field(default_factory=list)
    kernels: bool = False
    token_slots: torch.Tensor | None = None  # [T] int64
    row_slots: torch.Tensor | None = None  # [R] int64
    any_slot: bool = False

    def runs(self, reads_rows: bool) -> list[Run]:
        return self.row_runs if reads_rows else self.token_runs

    def slots(self, reads_rows: bool) -> torch.Tensor:
        return self.row_slots if reads_rows else self.token_slots


# q [T, Hq, D], k/v [T, Hkv, D], layer -> [T, Hq, D]: a backend's plan for this batch
BatchAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass(slots=True)
class ForwardBatch:
    """The device inputs of one forward, its planned attention (which holds the prefix cache's
    reads and inserts) and its adapters (None: the model alone on every row)."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    score_rows: torch.Tensor  # [R] int64: the rows whose hidden states are scored
    label_rows: torch.Tensor  # [N] int64: which score row each output belongs to
    label_ids: torch.Tensor  # [N] int64: which vocabulary entry (a classifier: which class)
    attention: BatchAttention
    lora: LoraRows | None = None
    # Called before each layer where the forward runs as it is called (the CPU): raises
    # BatchAbandoned (gpu_worker/serving/scheduler.py) once nobody waits for the batch's
    # results. None: run to the end (a queued CUDA forward is computed after the call).
    stop_if_abandoned: Callable[[], None] | None = None


def lora_runs(sequences: list[PackedSequence], adapters: list[int]) -> tuple[list[Run],
                                                                             list[Run]]:
    """The batch's runs of consecutive tokens and of score rows of one adapter (slot 0, the
    model alone, in none)."""
    tokens: list[Run] = []
    rows: list[Run] = []
    token_at = row_at = 0
    for seq, slot in zip(sequences, adapters, strict=True):
        n_rows = len(seq.score_rows)
        if slot:
            for runs, start, n in ((tokens, token_at, seq.num_tokens), (rows, row_at, n_rows)):
                if runs and runs[-1][0] == slot and runs[-1][2] == start:
                    runs[-1] = (slot, runs[-1][1], start + n)  # continues the last run
                else:
                    runs.append((slot, start, start + n))
        token_at += seq.num_tokens
        row_at += n_rows
    return tokens, rows


def lora_slot_lists(sequences: list[PackedSequence], adapters: list[int]
                    ) -> tuple[list[int], list[int]]:
    """Each token's and each score row's adapter slot (0: the model alone)."""
    tokens: list[int] = []
    rows: list[int] = []
    for seq, slot in zip(sequences, adapters, strict=True):
        tokens += [slot] * seq.num_tokens
        rows += [slot] * len(seq.score_rows)
    return tokens, rows
