"""Build a ready-to-use scorer (model + engine + scheduler) from a WorkerConfig, without Serve."""

from __future__ import annotations

import asyncio
import logging
import os

import torch

from gpu_worker.config import WorkerConfig
from gpu_worker.engine import DoneCallback, Engine, ScoreTask
from gpu_worker.loader import load_model
from gpu_worker.scheduler import Scheduler
from serve_app.packing import ScoreJob

logger = logging.getLogger(__name__)


def build_scheduler(cfg: WorkerConfig) -> Scheduler:
    if cfg.device == "cpu":
        torch.set_num_threads(cfg.torch_threads or os.cpu_count() or 1)
    elif not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was configured but torch sees no CUDA device")
    device = torch.device(cfg.device)
    model = load_model(cfg.model_path, getattr(torch, cfg.dtype), device)
    return Scheduler(Engine(model, device), cfg.max_batch_tokens, cfg.max_batch_sequences,
                     cfg.overlap)


async def score_job(scheduler: Scheduler, job: ScoreJob) -> list[list[list[float]]]:
    """Submit every sequence of a job and wait for all: per sequence, items × label log-probs."""
    loop = asyncio.get_running_loop()
    futures = []
    for seq in job.sequences:
        fut = loop.create_future()
        scheduler.submit(ScoreTask(seq, job.label_ids, _resolver(loop, fut)))
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
