"""Element-wise ops of the decoder in two implementations with one interface.

`TorchOps` follows HF's order of operations exactly (CPU, CI, and the GPU reference).
`CudaOps` uses fused GPU kernels, imported once when it is built (so CPU-only hosts never import
them, and no layer runs an import statement): our Triton kernels for residual-add + RMSNorm
with an fp32 residual stream (gpu_worker/kernels/add_norm.py) and for q/k norm + RoPE in place
(gpu_worker/kernels/qkv.py), the gate/up GEMM with SwiGLU fused for large batches
(gpu_worker/kernels/gate_up_silu.py), and FlashInfer's RMSNorm and SiLU-and-mul.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpu_worker.model.fp8 import quantize_rows
from ranker_contract.model_config import ModelConfig


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """[head_dim // 2] fp32 inverse frequencies, with llama3 scaling when the config asks."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class TorchOps:
    fused_gate_up = False  # the Triton GEMMs (CudaOps on Hopper) are not used

    def __init__(self, cfg: ModelConfig) -> None:
        self.inv_freq = rope_inv_freq(cfg)  # [head_dim // 2] fp32, CPU

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # fp32 statistics, cast back before the weight: HF's LlamaRMSNorm order.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x32.to(x.dtype)

    def add_rms_norm(self, x, residual, weight, eps):
        """(rms_norm(x + residual), x + residual)."""
        residual = x + residual
        return self.rms_norm(residual, weight, eps), residual

    def add_rms_norm_fp8(self, x, residual, weight, eps):
        """add_rms_norm with its rows quantized for an FP8 linear: ((e4m3, scales), residual)."""
        x, residual = self.add_rms_norm(x, residual, weight, eps)
        return quantize_rows(x), residual

    def start_residual(self, x: torch.Tensor) -> torch.Tensor:
        return x  # the model's dtype, as in HF

    def prepare_qkv(self, qkv, positions, attn):
        """The fused projection [T, (Hq + 2 Hk) D] → q [T, Hq, D], k, v [T, Hk, D]:
        q/k RMSNorm (Qwen3), then RoPE at the packed positions."""
        t = qkv.shape[0]
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q = q.reshape(t, attn.num_heads, attn.head_dim)
        k = k.reshape(t, attn.num_kv_heads, attn.head_dim)
        v = v.reshape(t, attn.num_kv_heads, attn.head_dim)
        if attn.q_norm is not None:
            q = self.rms_norm(q, attn.q_norm.weight, attn.q_norm.eps)
            k = self.rms_norm(k, attn.k_norm.weight, attn.k_norm.eps)
        q, k = self.rope(q, k, positions)
        return q, k, v

    def rope(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        """q [T, Hq, D], k [T, Hk, D]; rotate-half convention at the packed positions."""
        inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(q.dtype)[:, None, :], emb.sin().to(q.dtype)[:, None, :]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def gate_up_silu(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of the packed gate/up projection (no bias)."""
        return self.silu_and_mul(F.linear(x, weight))

    def log_sum_exp(self, logits: torch.Tensor) -> torch.Tensor:
        """[R, V] → [R] fp32, a row at a time: torch's reduction splits a few rows' sums over
        threads by the row count, and a row's result must not follow it (docs/ARCHITECTURE.md,
        "Deterministic scores")."""
        rows = logits.float()
        return torch.cat([torch.logsumexp(rows[r:r + 1], dim=-1) for r in range(len(rows))]
                         or [rows.new_empty(0)])

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


def _rope_cache(cfg: ModelConfig, device) -> torch.Tensor:
    """[max_positions, head_dim] fp32: cos of the half-frequencies, then sin."""
    positions = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
    freqs = positions[:, None] * rope_inv_freq(cfg)[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


# Batches from this many tokens run the fused gate/up GEMM; below it cuBLAS + silu_and_mul is
# faster (docs/ARCHITECTURE.md, "Engine").
FUSED_GATE_UP_MIN_TOKENS = 8192


class CudaOps:
    def __init__(self, cfg: ModelConfig, device: torch.device) -> None:
        # Imported here, once: a missing flashinfer or triton fails at start-up, clearly.
        from flashinfer.activation import silu_and_mul
        from flashinfer.norm import rmsnorm

        from gpu_worker.kernels.add_norm import add_rms_norm_fp32_residual
        from gpu_worker.kernels.logsumexp import log_sum_exp_rows
        from gpu_worker.kernels.qkv import qkv_prepare
        from gpu_worker.model.fp8 import FP8_MAX, MIN_SCALE

        self._rmsnorm = rmsnorm
        self._add_rms_norm_fp32_residual = add_rms_norm_fp32_residual
        self._fp8_limits = (FP8_MAX, MIN_SCALE)
        self._qkv_prepare, self._silu_and_mul = qkv_prepare, silu_and_mul
        self.log_sum_exp = log_sum_exp_rows  # a row's result independent of the batch
        # The fused kernel loads its tiles by TMA: Hopper (compute capability 9) or newer.
        self.fused_gate_up = torch.cuda.get_device_capability(device)[0] >= 9
        if self.fused_gate_up:  # its module needs a triton with TMA descriptors
            from gpu_worker.kernels.gate_up_silu import gate_up_silu

            self._gate_up_silu = gate_up_silu
        if cfg.head_dim & (cfg.head_dim - 1):  # the Triton kernel's tile is head_dim wide
            raise ValueError(f"head_dim {cfg.head_dim} is not a power of two")
        self.cos_sin_cache = _rope_cache(cfg, device)

    def rms_norm(self, x, weight, eps):
        shape = x.shape
        return self._rmsnorm(x.reshape(-1, shape[-1]), weight, eps).view(shape)

    def add_rms_norm(self, x, residual, weight, eps):
        # Both in place: residual += x, then x = rms_norm(residual).
        return self._add_rms_norm_fp32_residual(x, residual, weight, eps)

    def add_rms_norm_fp8(self, x, residual, weight, eps):
        # The same kernel writes the rows quantized for an FP8 linear, (e4m3, scales).
        return self._add_rms_norm_fp32_residual(x, residual, weight, eps, self._fp8_limits)

    def start_residual(self, x: torch.Tensor) -> torch.Tensor:
        # An fp32 residual stream is more exact, a little slower (gpu_worker/kernels/add_norm.py).
        return x.float()

    def prepare_qkv(self, qkv, positions, attn):
        has_norm = attn.q_norm is not None
        return self._qkv_prepare(
            qkv, positions, self.cos_sin_cache, attn.num_heads, attn.num_kv_heads,
            attn.head_dim, attn.q_norm.weight if has_norm else None,
            attn.k_norm.weight if has_norm else None,
            attn.q_norm.eps if has_norm else 0.0,
        )

    def gate_up_silu(self, x, weight):
        if self.fused_gate_up and x.shape[0] >= FUSED_GATE_UP_MIN_TOKENS:
            return self._gate_up_silu(x, weight)
        return self._silu_and_mul(F.linear(x, weight))

    def silu_and_mul(self, gate_up):
        return self._silu_and_mul(gate_up)
