"""Settings of one scorer replica (built by the app builder from its validated args)."""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    model_path: str
    device: str = "cpu"  # "cpu" or "cuda"
    dtype: str = "float32"
    max_batch_tokens: int = 8192  # tokens per forward, across sequences; 0 = from free GPU memory
    max_batch_sequences: int = 256
    max_seq_tokens: int = 8192  # the longest sequence the ingress sends (runs alone if need be)
    overlap: bool = True  # launch batch N+1 before finishing batch N
    max_queued_tokens: int = 0  # admission: refuse requests beyond this many waiting; 0 = no limit
    torch_threads: int = 0  # CPU only; 0 = one per core
    attention: str = "torch"  # "torch" (SDPA + explicit mask) or "flashinfer" (GPU)
    ops: str = "torch"  # element-wise kernels: "torch" or "cuda" (FlashInfer + Triton, GPU)
    flashinfer_backend: str = "fa2"  # "fa2" or "fa3" (multi-item fa2 measured faster)
    fp32_residual: bool = True  # ops "cuda": fp32 residual stream (more exact, ~4% slower)

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', not {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, not {self.dtype!r}")
        if self.max_batch_tokens < 0 or self.max_batch_sequences < 1:
            raise ValueError("max_batch_tokens must be >= 0 and max_batch_sequences positive")
        if self.max_queued_tokens < 0:
            raise ValueError("max_queued_tokens must be >= 0")
        if self.max_batch_tokens == 0 and self.device != "cuda":
            raise ValueError("max_batch_tokens = 0 (from free memory) needs device 'cuda'")
        for name, fast in (("attention", "flashinfer"), ("ops", "cuda")):
            if getattr(self, name) not in ("torch", fast):
                raise ValueError(f"{name} must be 'torch' or {fast!r}")
            if getattr(self, name) == fast and self.device != "cuda":
                raise ValueError(f"{name} {fast!r} needs device 'cuda'")
        if self.flashinfer_backend not in ("fa2", "fa3"):
            raise ValueError("flashinfer_backend must be 'fa2' or 'fa3'")
