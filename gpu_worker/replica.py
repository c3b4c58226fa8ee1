"""What a scorer starts with, a Serve replica (gpu_worker/deployment.py) or a batch job's actor
(ranker_batch/stages.py): the engine on its device, the batch budget its memory allows, every
kernel warmed up, and the scheduling loop running."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_worker.engine import Engine
from gpu_worker.heads import rerank_label_ids
from gpu_worker.lora import load_adapter
from gpu_worker.scheduler import Scheduler
from gpu_worker.startup import BatchBudget, measure_budget, warm_up
from ranker_contract.config import AppConfig, SchedulerConfig


@dataclass(frozen=True, slots=True)
class Scorer:
    engine: Engine
    budget: BatchBudget
    scheduler: Scheduler  # started


def start_scorer(config: AppConfig, scheduler: SchedulerConfig | None = None) -> Scorer:
    """`scheduler`: replaces config.scheduler (an offline job refuses nothing)."""
    head_from_labels = (rerank_label_ids(config.resolved_model_path(),
                                         config.rerank.resolved_prompt())
                        if config.rerank.classifier_from_labels else None)
    engine = Engine.from_config(config.resolved_model_path(), config.engine, head_from_labels)
    for folder in config.resolved_adapter_paths():  # slots 1, 2, ... in the config's order
        engine.add_adapter(load_adapter(folder, engine.model.config, engine.dtype,
                                        engine.device))
    budget = measure_budget(engine, config.scheduler.max_batch_tokens,
                            config.limits.max_seq_tokens)
    # Before ready: a new request shape must not wait on a compile (a new replica neither).
    warm_up(engine, budget.tokens, config.limits.max_seq_tokens)
    loop = Scheduler(engine, scheduler or config.scheduler, batch_token_budget=budget.tokens)
    loop.start()
    return Scorer(engine, budget, loop)
