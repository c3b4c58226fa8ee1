"""Build a ready-to-use scorer (model + engine + scheduler) from a WorkerConfig, without Serve."""

from __future__ import annotations

import asyncio
import logging
import os

import torch

from gpu_worker.config import WorkerConfig
from gpu_worker.engine import DoneCallback, Engine, ScoreTask
from gpu_worker.errors import ScorerOverloaded
from gpu_worker.loader import load_model
from gpu_worker.scheduler import Scheduler
from serve_app.packing import ScoreJob, pack_multi_item

logger = logging.getLogger(__name__)

# Share of free GPU memory (after weights) that batch activations may use.
MEMORY_FRACTION = 0.8
PROBE_TOKENS = 8192  # about one bench-sized batch slice; activations scale linearly


def build_engine(cfg: WorkerConfig) -> Engine:
    if cfg.device == "cpu":
        torch.set_num_threads(cfg.torch_threads or os.cpu_count() or 1)
    elif not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was configured but torch sees no CUDA device")
    device = torch.device(cfg.device)
    model = load_model(cfg.model_path, getattr(torch, cfg.dtype), device)
    return Engine(model, device, cfg.attention, cfg.ops, cfg.flashinfer_backend,
                  cfg.fp32_residual)


def build_scheduler(cfg: WorkerConfig) -> Scheduler:
    engine = build_engine(cfg)
    budget = cfg.max_batch_tokens
    if engine.device.type == "cuda":
        budget = warm_up(engine, budget, cfg.max_seq_tokens)
    return Scheduler(engine, budget, cfg.max_batch_sequences, cfg.overlap)


def warm_up(engine: Engine, max_batch_tokens: int, min_batch_tokens: int) -> int:
    """Run a multi-item probe batch: compiles every kernel before the replica reports ready,
    and measures activation memory per token. Returns the batch token budget:

        budget = MEMORY_FRACTION * free_memory_after_weights / peak_bytes_per_token

    capped by `max_batch_tokens` when that is set (> 0); it must hold `min_batch_tokens` (the
    longest sequence the ingress may send).
    """
    items = [list(range(200, 380))] * (PROBE_TOKENS // 181 - 1)  # ~PROBE_TOKENS in all
    tasks = [ScoreTask(pack_multi_item(list(range(1, 121)), items, 0), [1, 2], lambda _: None)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    engine.finish(engine.launch(tasks))
    per_token = (torch.cuda.max_memory_allocated() - base) / sum(t.num_tokens for t in tasks)
    free, _ = torch.cuda.mem_get_info()
    budget = int(MEMORY_FRACTION * (free + torch.cuda.memory_reserved() - base) / per_token)
    if max_batch_tokens > 0:
        budget = min(budget, max_batch_tokens)
    if budget < min_batch_tokens:
        # A sequence the ingress accepts always runs, alone if need be: it must fit in memory.
        raise RuntimeError(f"GPU memory fits batches of {budget} tokens, fewer than "
                           f"max_seq_tokens={min_batch_tokens}: lower max_seq_tokens")
    logger.info("warm-up done: %.0f activation bytes per token; batch budget %d tokens",
                per_token, budget)
    return budget


async def score_job(
    scheduler: Scheduler, job: ScoreJob, max_queued_tokens: int = 0
) -> list[list[list[float]]]:
    """Submit every sequence of a job and wait for all: per sequence, items × label log-probs.

    Admission: with `max_queued_tokens` > 0 a job that would push the tokens waiting past it
    raises ScorerOverloaded (nothing is queued). A job always gets in when nothing waits, so a
    request larger than the limit is slow, never refused forever.
    """
    queued = scheduler.depth().queued_tokens
    tokens = sum(seq.num_tokens for seq in job.sequences)
    if max_queued_tokens > 0 and queued > 0 and queued + tokens > max_queued_tokens:
        raise ScorerOverloaded(queued, max_queued_tokens)
    loop = asyncio.get_running_loop()
    futures = []
    for seq in job.sequences:
        fut = loop.create_future()
        # NOTE: if the request is cancelled (client gone, timeout), gather cancels these
        # futures; the loop thread reads fut.cancelled() and drops the task unscored.
        scheduler.submit(ScoreTask(seq, job.label_ids, _resolver(loop, fut), fut.cancelled))
        futures.append(fut)
    return list(await asyncio.gather(*futures))


def _resolver(loop: asyncio.AbstractEventLoop, fut: asyncio.Future) -> DoneCallback:
    def on_done(result):
        loop.call_soon_threadsafe(_settle, fut, result)

    return on_done


def _settle(fut: asyncio.Future, result) -> None:
    if fut.done():  # the caller went away
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)
