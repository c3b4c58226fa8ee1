"""Settings of one scorer replica (built by the app builder from its validated args)."""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    model_path: str
    device: str = "cpu"  # "cpu" or "cuda"
    dtype: str = "float32"
    max_batch_tokens: int = 8192  # tokens per forward, across sequences
    max_batch_sequences: int = 256
    overlap: bool = True  # launch batch N+1 before finishing batch N
    torch_threads: int = 0  # CPU only; 0 = one per core

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', not {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, not {self.dtype!r}")
        if self.max_batch_tokens < 1 or self.max_batch_sequences < 1:
            raise ValueError("max_batch_tokens and max_batch_sequences must be positive")
