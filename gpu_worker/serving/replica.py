"""What a scorer starts with, a Serve replica (gpu_worker/serving/deployment.py) or a batch job's
actor (ranker_batch/stages.py): the engine on its device, the batch budget its memory allows, every
kernel warmed up, and the scheduling loop running."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import torch

from gpu_worker.forward.engine import Engine
from gpu_worker.forward.startup import BatchBudget, measure_budget, warm_up
from gpu_worker.model.heads import rerank_label_ids
from gpu_worker.model.lora import load_adapter
from gpu_worker.serving.adapter_slots import AdapterSlots
from gpu_worker.serving.scheduler import Scheduler
from ranker_contract.config import AppConfig, SchedulerConfig


@dataclass(frozen=True, slots=True)
class Scorer:
    engine: Engine
    budget: BatchBudget
    scheduler: Scheduler  # started

    def stop(self, drain_s: float) -> None:
        """Stop the loop once it has answered what it accepted, waiting at most `drain_s`; what
        is left then fails (gpu_worker/serving/scheduler.py::Scheduler.stop)."""
        deadline = time.monotonic() + drain_s
        while not self.scheduler.depth().empty and time.monotonic() < deadline:
            time.sleep(0.01)
        self.scheduler.stop()


def release_memory() -> None:
    """Hand the memory of scorers no longer referenced back to the device, for another process
    or a model loaded next."""
    gc.collect()  # an engine's modules refer to each other
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def start_scorer(config: AppConfig, scheduler: SchedulerConfig | None = None,
                 memory_share: float = 1.0) -> Scorer:
    """`scheduler`: replaces config.scheduler (an offline job refuses nothing). `memory_share`:
    the part of the GPU's free memory this scorer's batches may use (AppConfig.memory_share)."""
    head_from_labels = (rerank_label_ids(config.resolved_model_path(),
                                         config.rerank.resolved_prompt())
                        if config.rerank.classifier_from_labels else None)
    engine = Engine.from_config(config.resolved_model_path(), config.engine, head_from_labels,
                                config.lora if config.adapters else None)
    adapters = _load_adapters(engine, config)
    budget = measure_budget(engine, config.scheduler.max_batch_tokens,
                            config.limits.max_seq_tokens, memory_share)
    # Before ready: a new request shape must not wait on a compile (a new replica neither).
    warm_up(engine, budget.tokens, config.limits.max_seq_tokens)
    loop = Scheduler(engine, scheduler or config.scheduler, batch_token_budget=budget.tokens,
                     adapters=adapters, capacity_tokens_per_s=budget.capacity_tokens_per_s)
    loop.start()
    return Scorer(engine, budget, loop)


def _load_adapters(engine: Engine, config: AppConfig) -> AdapterSlots | None:
    """Every adapter is read once, so that one the engine cannot serve stops the start; the
    first ones fill the slots (adapter k in slot k), the others load on first use."""
    if not config.adapters:
        return None
    paths, cfg = config.resolved_adapter_paths(), engine.model.config

    def read(adapter: int):
        return load_adapter(paths[adapter - 1], cfg, engine.dtype, torch.device("cpu"))

    resident = {}
    for adapter in range(1, len(paths) + 1):
        read_one = read(adapter)
        engine.check_adapter(read_one)
        if adapter <= config.lora.slots:
            engine.put_adapter(adapter, read_one)
            resident[adapter] = adapter
    return AdapterSlots(len(paths), config.lora.slots, resident, read, engine.put_adapter)
