"""Strict check of a Serve config file: `python -m ranker_app.check_config configs/score.yaml`.

Serve's own schema silently ignores unknown keys (a typo like `max_concurrent_queries` runs with
the default). This checks the file against Serve's schema AND against strict models of the keys
this project uses, so a typo fails before anything starts.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ranker_app.autoscaling_policy import ScorerLoadPolicy
from ranker_contract.config import AppConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Policy(_Strict):
    policy_function: Literal["ranker_app.autoscaling_policy:ScorerLoadPolicy"]
    policy_kwargs: dict = {}

    @model_validator(mode="after")
    def _kwargs_fit(self) -> "Policy":
        try:  # a wrong or missing kwarg fails here, not on the controller later
            ScorerLoadPolicy(**self.policy_kwargs)
        except TypeError as exc:
            raise ValueError(f"policy_kwargs: {exc}") from None
        return self


class RuntimeEnv(_Strict):
    env_vars: dict[str, str] = {}


class Autoscaling(_Strict):
    min_replicas: int
    max_replicas: int
    initial_replicas: int | None = None
    target_ongoing_requests: float | None = None
    upscale_delay_s: float | None = None
    downscale_delay_s: float | None = None
    look_back_period_s: float | None = None
    metrics_interval_s: float | None = None
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None
    aggregation_function: Literal["mean", "max", "min"] | None = None
    policy: Policy | None = None


class ActorOptions(_Strict):
    num_cpus: float | None = None
    num_gpus: float | None = None
    memory: float | None = None
    runtime_env: dict | None = None


class Backpressure(_Strict):
    status_code: Literal[503, 429] = 503
    retry_after_s: float | None = None


class Deployment(_Strict):
    name: Literal["ScoreIngress", "ScoreWorker"]
    num_replicas: int | Literal["auto"] | None = None
    max_ongoing_requests: int | None = None
    max_queued_requests: int | None = None
    backpressure_config: Backpressure | None = None
    ray_actor_options: ActorOptions | None = None
    autoscaling_config: Autoscaling | None = None
    health_check_period_s: float | None = None
    health_check_timeout_s: float | None = None
    graceful_shutdown_timeout_s: float | None = None
    graceful_shutdown_wait_loop_s: float | None = None


class Application(_Strict):
    name: str
    route_prefix: str | None = "/"
    import_path: Literal["ranker_app.app:build_app"]
    runtime_env: RuntimeEnv | None = None
    args: AppConfig
    deployments: list[Deployment] = []


class HttpOptions(_Strict):
    host: str | None = None
    port: int | None = None
    request_timeout_s: float | None = None
    keep_alive_timeout_s: float | None = None
    root_path: str | None = None


class ServeConfig(_Strict):
    proxy_location: Literal["EveryNode", "HeadOnly", "Disabled"] | None = None
    http_options: HttpOptions | None = None
    logging_config: dict | None = None
    applications: list[Application]


def check_config(path: str | Path) -> ServeConfig:
    """Raises ValueError naming every problem found."""
    from ray.serve.schema import ServeDeploySchema

    data = yaml.safe_load(Path(path).read_text())
    try:
        ServeDeploySchema.model_validate(data)
        return ServeConfig.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{path}: {exc}") from None


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m ranker_app.check_config CONFIG.yaml ...", file=sys.stderr)
        return 2
    status = 0
    for path in argv:
        try:
            check_config(path)
            print(f"{path}: ok")
        except (ValueError, OSError) as exc:
            print(exc, file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
