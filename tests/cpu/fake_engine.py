"""A plain-Python engine for tests of the scheduling loop
(gpu_worker/serving/scheduler.py::BatchEngine): no model, deterministic scores, and hooks to fail a
batch or to hold it on the "device"."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpu_worker.serving.scheduler import BatchAbandoned
from ranker_contract.packing import PackedSequence

HOLD_TIMEOUT_S = 30.0  # a held batch the test forgot to release fails instead of hanging


def fake_scores(sequence: PackedSequence, label_ids: list[int]) -> list[list[float]]:
    """Per item, one value per label, computed from the sequence's own tokens: a result handed to
    the wrong task, or a row to the wrong item, shows."""
    base = float(sum(i * token for i, token in enumerate(sequence.input_ids, 1)))
    return [[base + item + label / 1000 for label in label_ids]
            for item in range(sequence.num_items)]


@dataclass
class FakeStep:
    number: int  # launch order, from 0
    scores: list[list[list[float]]]


class FakeEngine:
    """Records every launch and finish. A batch holding a `poisoned` sequence raises `error` at
    launch, the way a device error would. hold() keeps finish() waiting until release().
    `asynchronous`: as a GPU engine (the loop overlaps), or False as the CPU's."""

    def __init__(self, poisoned: tuple[PackedSequence, ...] = (),
                 error: BaseException | None = None, asynchronous: bool = True) -> None:
        self.asynchronous = asynchronous
        self.poisoned = {id(seq) for seq in poisoned}
        self.error = error if error is not None else RuntimeError("poisoned batch")
        self.batches: list[list[int]] = []  # ids of the sequences of each launch
        # per launch, how many earlier batches were launched and not yet finished
        self.on_device_at_launch: list[int] = []
        self.adapters: list[list[int] | None] = []  # the `adapters` of each launch
        self.events: list[tuple[str, int]] = []  # ("launch" | "finish", batch number), in order
        self.finishing = threading.Event()  # set once a finish() has begun
        self.launching = threading.Event()  # set once a launch() has begun
        self._released = threading.Event()
        self._released.set()
        self._launch_released = threading.Event()
        self._launch_released.set()

    def hold(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def hold_launch(self) -> None:
        """A synchronous engine's launch() computes: keep it computing until release_launch(),
        then ask `abandoned` as a real one does before its next layer."""
        self._launch_released.clear()

    def release_launch(self) -> None:
        self._launch_released.set()

    def launch(self, sequences: list[PackedSequence], label_ids_per_sequence: list[list[int]],
               *, adapters: list[int] | None = None, cache_owners: list[str] | None = None,
               abandoned: Callable[[], bool] | None = None) -> FakeStep:
        number = len(self.batches)
        self.launching.set()
        if not self.asynchronous and abandoned is not None:  # computes as it is called
            if not self._launch_released.wait(HOLD_TIMEOUT_S):
                raise TimeoutError("the test never released its held launch")
            if abandoned():
                self.batches.append([id(seq) for seq in sequences])
                self.events.append(("abandoned", number))
                raise BatchAbandoned("nobody waits")
        self.batches.append([id(seq) for seq in sequences])
        self.on_device_at_launch.append(sum(kind == "launch" for kind, _ in self.events)
                                        - sum(kind == "finish" for kind, _ in self.events))
        self.adapters.append(adapters)
        if any(id(seq) in self.poisoned for seq in sequences):
            raise self.error
        self.events.append(("launch", number))
        return FakeStep(number, [fake_scores(seq, ids) for seq, ids
                                 in zip(sequences, label_ids_per_sequence, strict=True)])

    def finish(self, step: FakeStep) -> list[list[list[float]]]:
        self.finishing.set()
        if not self._released.wait(HOLD_TIMEOUT_S):
            raise TimeoutError("the test never released its held batch")
        self.events.append(("finish", step.number))
        return step.scores
