"""The decoder forward for Llama, Qwen2 and Qwen3: prefill only.

Parameter names are HF's, except the two packed projections that every serving engine uses:
`qkv_proj` (q, k, v stacked) and `gate_up_proj` (gate, up stacked); the loader stacks them from
the checkpoint (`PACKED_MODULES`). The forward reads one ForwardBatch (gpu_worker/forward/batch.py:
the inputs, the batch's planned attention, its adapters), passed explicitly down to every layer
and linear; the decoder returns final hidden states only at the score rows and the head turns them
into label log-probabilities. Element-wise ops come from `ops` (TorchOps or CudaOps,
gpu_worker/model/ops.py).

Each decoder linear's precision is fixed at load: a `Linear` here (bf16), or an `Fp8Linear`
(gpu_worker/model/fp8.py) put in its place. Both read their input in their own form and say how the
layer makes it (`normed_rows`, `swiglu`), so the forward is one path whatever each linear runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from gpu_worker.forward.batch import BatchAttention, ForwardBatch, LoraRows
from ranker_contract.model_config import ModelConfig
from ranker_contract.packing import PackedSequence

# packed parameter -> the checkpoint's parameters, stacked along the output dimension
PACKED_MODULES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


class AttentionBackend(Protocol):
    """TorchAttention (gpu_worker/attention/sdpa.py) or FlashInferAttention: plans one
    batch's attention from the packing metadata; the plan is the batch's (ForwardBatch.attention)
    and is called once per layer."""

    def plan(self, sequences: list[PackedSequence], dtype: torch.dtype,
             cached_slots: list[Sequence[int] | None] | None = None) -> BatchAttention:
        """The batch's attention: q [T, Hq, D], k/v [T, Hkv, D] for the whole batch, and the
        layer → [T, Hq, D]; it holds every tensor it needs until the batch finished.
        `cached_slots[i]`: the slots of the prefix cache's pool (given at construction)
        holding sequence i's first query rows, which it does not compute, or None."""
        ...


class Ops(Protocol):
    def rms_norm(self, x, weight, eps): ...
    def add_rms_norm(self, x, residual, weight, eps): ...
    def add_rms_norm_fp8(self, x, residual, weight, eps): ...
    def start_residual(self, x): ...
    def prepare_qkv(self, qkv, positions, attn: Attention): ...
    def gate_up_silu(self, x, weight): ...
    def silu_and_mul(self, gate_up): ...
    def log_sum_exp(self, logits): ...


class Linear(nn.Linear):
    """A linear in the model's float dtype (the decoder's, the LM head); its input is plain
    rows [M, K]."""

    # Set by the engine where scores are deterministic, so a row's result never follows how
    # many rows its batch has (docs/ARCHITECTURE.md, "Deterministic scores"):
    # - `min_rows`: fewer rows are padded up to this many; below it cuBLAS splits the K sum by
    #   the row count, and the CPU's BLAS takes a matrix-vector path.
    # - `chunk_rows` (CPU, a linear with K > N): every GEMM runs on exactly this many rows, the
    #   last chunk padded; there MKL picks its split of the K sum between threads by the row
    #   count. A multiple of 16, so each chunk of a fresh fp32 tensor starts 64-byte aligned.
    min_rows = 1
    chunk_rows = 0

    def forward(self, x: torch.Tensor, lora: LoraRows | None = None) -> torch.Tensor:
        """`lora`: the batch's adapters, which only a LoRA linear (gpu_worker/model/lora.py)
        reads."""
        return self._deterministic(super().forward, x)

    def _deterministic(self, fn, x: torch.Tensor) -> torch.Tensor:
        """fn(x) (a row-wise function of a GEMM of x), on padded rows or chunks of rows as set
        above, its result cut back to x's rows."""
        rows = x.shape[0]
        if self.chunk_rows:
            pad = -rows % self.chunk_rows
            padded = nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
            parts = [fn(part) for part in padded.split(self.chunk_rows)]
            return (parts[0] if len(parts) == 1 else torch.cat(parts))[:rows]
        if rows >= self.min_rows:
            return fn(x)
        return fn(nn.functional.pad(x, (0, 0, 0, self.min_rows - rows)))[:rows]

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """`x` in the form this linear reads."""
        return x

    def normed_rows(self, x, residual, norm: RMSNorm, ops: Ops):
        """(rms_norm(x + residual) in this linear's input form, x + residual)."""
        return ops.add_rms_norm(x, residual, norm.weight, norm.eps)

    def swiglu(self, x, down: Linear, ops: Ops, lora: LoraRows | None = None):
        """As the gate/up projection: SiLU(gate) * up of x, in `down`'s input form (one fused
        GEMM + SwiGLU on CudaOps when the batch is large)."""
        return down.rows(self._deterministic(
            lambda rows: ops.gate_up_silu(rows, self.weight), x))

    def swiglu_rows(self, gate_up: torch.Tensor, ops: Ops):
        """As the down projection: SiLU(gate) * up of a gate/up output, in this input form."""
        return ops.silu_and_mul(gate_up)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer  # which layer's K/V a prefix cache reads and writes
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                               bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, batch: ForwardBatch, ops: Ops, rows=None):
        """x: in qkv_proj's input form. `rows`: keep only these rows of the output (every row
        still serves as key/value)."""
        q, k, v = ops.prepare_qkv(self.qkv_proj(x, batch.lora), batch.positions, self)
        out = batch.attention(q, k, v, self.layer).reshape(q.shape[0], self.q_size)
        if rows is not None:
            out = out.index_select(0, rows)
        return self.o_proj(self.o_proj.rows(out), batch.lora)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x, ops: Ops, lora: LoraRows | None) -> torch.Tensor:
        """x: in gate_up_proj's input form."""
        return self.down_proj(self.gate_up_proj.swiglu(x, self.down_proj, ops, lora), lora)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, batch: ForwardBatch, ops: Ops, rows=None):
        """x: the previous sublayer's output, added to `residual` here (fused with the norm).
        With `rows`, everything after attention runs on those rows only."""
        qkv_proj, norm = self.self_attn.qkv_proj, self.input_layernorm
        if residual is None:  # the first layer: the embeddings start the residual stream
            residual = ops.start_residual(x)
            x = qkv_proj.rows(ops.rms_norm(x, norm.weight, norm.eps))
        else:
            x, residual = qkv_proj.normed_rows(x, residual, norm, ops)
        x = self.self_attn(x, batch, ops, rows)
        if rows is not None:
            residual = residual.index_select(0, rows)
        x, residual = self.mlp.gate_up_proj.normed_rows(x, residual, self.post_attention_layernorm,
                                                        ops)
        return self.mlp(x, ops, batch.lora), residual


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # Given an (uninitialised) weight, nn.Embedding skips its random init: the loader builds
        # the model on the meta device, where normal_ imports torch._dynamo (seconds of a
        # replica's start). The loader assigns the real weights.
        self.embed_tokens = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size,
            _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, batch: ForwardBatch, ops: Ops) -> torch.Tensor:
        """Final-norm hidden states at the batch's score rows: [R, hidden]."""
        x, residual = self.embed_tokens(batch.input_ids), None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            if batch.stop_if_abandoned is not None:
                batch.stop_if_abandoned()
            # Nothing reads the last layer's output at other rows: its o_proj, MLP and the
            # final norm run only at the score rows.
            x, residual = layer(x, residual, batch, ops, batch.score_rows if i == last else None)
        x, _ = ops.add_rms_norm(x, residual, self.norm.weight, self.norm.eps)
        return x


class CausalLMForScoring(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, batch: ForwardBatch, ops: Ops) -> torch.Tensor:
        """[N] fp32 log-probabilities over the full vocabulary, gathered at the batch's
        (label row, label id) pairs."""
        logits = self.lm_head(self.model(batch, ops))  # [R, V]: lm_head only at the score rows
        log_z = ops.log_sum_exp(logits)  # [R] fp32
        return logits[batch.label_rows, batch.label_ids].float() - log_z[batch.label_rows]
