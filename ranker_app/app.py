"""The Serve application builder named by `import_path` in configs/*.yaml."""

# NOTE: no `from __future__ import annotations` here: Serve reads build_app's annotation at run
# time to validate `args` into AppConfig, and a string annotation would hand us a plain dict.

import logging

from ray.serve import Application

from ranker_contract.config import AppConfig, from_repository
from ranker_contract.model_config import ModelFolderError

logger = logging.getLogger(__name__)

PREPARE_COMMAND = "python scripts/prepare_model.py  (or: bash scripts/setup.sh)"


def build_app(args: AppConfig) -> Application:
    from ray.serve.config import RequestRouterConfig

    from gpu_worker.serving.deployment import ScoreWorker
    from ranker_app.scorer_router import ScorerRouter
    from serve_app.ingress import ScoreIngress
    from serve_app.quota_ledger import QuotaLedger

    model_path = args.resolved_model_path()
    if not (model_path / "config.json").is_file():
        raise ModelFolderError(
            f"model folder {model_path} is missing or has no config.json; "
            f"to create the default model run: {PREPARE_COMMAND}"
        )
    for k, entry in enumerate(args.models):  # here, not on a first request to it
        if not (from_repository(entry.path) / "config.json").is_file():
            raise ModelFolderError(f"models[{k}] ({entry.name}): model folder "
                                   f"{from_repository(entry.path)} is missing or has no "
                                   "config.json")
    if args.auth.enabled:  # fail here, naming the setting, not later in every replica
        from serve_app.auth import load_keys
        load_keys(args.auth)
    config = args.model_copy(update={"model_path": str(model_path)})
    logger.info("building score app: %s", config)
    # By outstanding tokens, and repeats of a cached query to the replica that holds it.
    worker = ScoreWorker.options(request_router_config=RequestRouterConfig(
        request_router_class=ScorerRouter))
    # With API keys, one quota ledger for every ingress replica (serve_app/quota_ledger.py).
    ledger = QuotaLedger.bind() if config.auth.enabled else None
    return ScoreIngress.bind(worker.bind(config), config, ledger)
