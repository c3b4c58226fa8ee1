"""The Serve application builder named by `import_path` in configs/*.yaml."""

# NOTE: no `from __future__ import annotations` here: Serve reads build_app's annotation at run
# time to validate `args` into AppArgs, and a string annotation would hand us a plain dict.

import logging
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from ray.serve import Application

from gpu_worker.config import WorkerConfig
from gpu_worker.model_config import ModelConfig, ModelFolderError
from serve_app.validate import Limits

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_PATH = "models/smollm2-135m-instruct"
PREPARE_COMMAND = "python scripts/prepare_model.py  (or: bash scripts/setup.sh)"


class AppArgs(BaseModel):
    """`args:` of the application. Unknown keys are errors: Serve itself would ignore them."""

    model_config = ConfigDict(extra="forbid")

    model_path: str = Field(DEFAULT_MODEL_PATH, description="HF folder; relative to the repo")
    served_model_name: str = "smollm2-135m-instruct"
    device: str = "cpu"
    dtype: str = "float32"
    max_batch_tokens: int = Field(8192, ge=0, description="0: derived from free GPU memory")
    max_batch_sequences: int = Field(256, gt=0)
    overlap: bool = True
    max_queued_tokens: int = Field(0, ge=0, description="per replica; beyond → 503; 0 = no limit")
    torch_threads: int = Field(0, ge=0)
    attention: Literal["torch", "flashinfer"] = "torch"
    ops: Literal["torch", "cuda"] = "torch"
    flashinfer_backend: Literal["fa2", "fa3"] = "fa2"
    fp32_residual: bool = True
    max_items_per_request: int = Field(1024, gt=0)
    max_labels_per_request: int = Field(64, gt=0)
    max_tokens_per_request: int = Field(65536, gt=0)
    max_seq_tokens: int = Field(8192, gt=1)
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)

    @model_validator(mode="after")
    def _seq_fits_batch(self) -> "AppArgs":
        if 0 < self.max_batch_tokens < self.max_seq_tokens:
            raise ValueError("max_seq_tokens must not exceed max_batch_tokens")
        return self

    def resolved_model_path(self) -> Path:
        path = Path(self.model_path)
        return path if path.is_absolute() else REPO_ROOT / path


def build_app(args: AppArgs) -> Application:
    from gpu_worker.deployment import ScoreWorker
    from serve_app.ingress import ScoreIngress

    model_path = args.resolved_model_path()
    if not (model_path / "config.json").is_file():
        raise ModelFolderError(
            f"model folder {model_path} is missing or has no config.json; "
            f"to create the default model run: {PREPARE_COMMAND}"
        )
    model_cfg = ModelConfig.from_folder(model_path)
    limits = Limits(
        max_body_bytes=args.max_body_bytes,
        max_items=args.max_items_per_request,
        max_labels=args.max_labels_per_request,
        max_request_tokens=args.max_tokens_per_request,
        max_seq_tokens=args.max_seq_tokens,
        max_context=model_cfg.max_position_embeddings,
    )
    worker_cfg = WorkerConfig(
        model_path=str(model_path),
        device=args.device,
        dtype=args.dtype,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_sequences=args.max_batch_sequences,
        max_seq_tokens=args.max_seq_tokens,
        overlap=args.overlap,
        max_queued_tokens=args.max_queued_tokens,
        torch_threads=args.torch_threads,
        attention=args.attention,
        ops=args.ops,
        flashinfer_backend=args.flashinfer_backend,
        fp32_residual=args.fp32_residual,
    )
    logger.info("building score app: %s, %s", worker_cfg, limits)
    worker = ScoreWorker.bind(worker_cfg)
    return ScoreIngress.bind(worker, str(model_path), args.served_model_name,
                             model_cfg.vocab_size, limits)
