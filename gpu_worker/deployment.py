"""The scorer replica as a Ray Serve deployment."""

from __future__ import annotations

import logging

from ray import serve

from gpu_worker.config import WorkerConfig
from gpu_worker.worker import build_scheduler, score_job
from serve_app.packing import ScoreJob

logger = logging.getLogger(__name__)

# Code defaults; configs/*.yaml may override any of them per deployment.
DEFAULT_OPTIONS = {
    # The replica batches internally: let many requests in so its loop always has work.
    "max_ongoing_requests": 1024,
    "ray_actor_options": {"num_cpus": 1, "num_gpus": 0},
    "health_check_period_s": 5,
}


@serve.deployment(**DEFAULT_OPTIONS)
class ScoreWorker:
    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.scheduler = build_scheduler(cfg)
        self.scheduler.start()
        logger.info("ScoreWorker ready: %s", cfg)

    async def score(self, job: ScoreJob) -> list[list[list[float]]]:
        return await score_job(self.scheduler, job)

    def ping(self) -> bool:
        self.check_health()
        return True

    def check_health(self) -> None:
        if not self.scheduler.alive:
            raise RuntimeError("the scheduling loop thread died")

    def __del__(self) -> None:
        scheduler = getattr(self, "scheduler", None)
        if scheduler is not None:
            scheduler.stop()
