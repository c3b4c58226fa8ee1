"""`flashinfer` attention backend: multi-item prefill over the batch's own K/V (GPU only).

FlashInfer applies the multi-item mask only through BatchPrefillWithPagedKVCacheWrapper (the
ragged wrapper silently ignores it), so K/V are viewed as pages of one token: page indices are
0..T-1, kv_indptr equals qo_indptr and every last page holds one token. No KV cache is kept.
Plain causal sequences share the batch with prefix_len = their length and an all-zero slot.
"""

from __future__ import annotations

import array

import torch

from ranker_contract.model_config import ModelConfig
from ranker_contract.packing import PackedSequence

WORKSPACE_BYTES = 256 << 20
MAX_ITEM_POS = 65535  # token_pos_in_items and max_item_len are uint16 in the kernel


def token_pos_rows(rows: list[list[int]], stride: int) -> array.array:
    """The sequences' token positions in their items, one row per sequence, each padded with
    zeros to `stride`: the uint16 layout the multi-item kernel reads."""
    zeros = array.array("H", bytes(2 * stride))
    out = array.array("H")
    for row in rows:
        out.extend(row)
        out.extend(zeros[len(row):])
    return out


class FlashInferAttention:
    """One per engine. `plan()` once per batch, then the model calls it once per layer."""

    def __init__(self, cfg: ModelConfig, device: torch.device, backend: str = "fa2") -> None:
        import flashinfer

        self.cfg = cfg
        self.device = device
        self.workspace_gpu = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace_gpu, "NHD", backend=backend)
        self.page_ids_gpu = torch.arange(0, dtype=torch.int32, device=device)
        self._plan_copied: torch.cuda.Event | None = None

    def _wait_for_previous_plan(self) -> None:
        # NOTE: plan() stages its schedule in a pinned buffer that every plan() rewrites; the
        # previous plan's copy out of it must have run before we overwrite it.
        if self._plan_copied is not None:
            self._plan_copied.synchronize()

    def _plan_issued(self) -> None:
        self._plan_copied = torch.cuda.Event()
        self._plan_copied.record()

    def plan(self, sequences: list[PackedSequence], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """Plan the batch; returns the tensors that must stay alive until the batch finished."""
        lengths = [s.num_tokens for s in sequences]
        total = sum(lengths)
        if self.page_ids_gpu.numel() < total:
            self.page_ids_gpu = torch.arange(max(total, 2 * self.page_ids_gpu.numel()),
                                             dtype=torch.int32, device=self.device)
        # NOTE: qo_indptr stays on the host: plan() reads it there, so a CPU tensor means no sync
        # (max_token_per_sequence / max_sequence_kv would skip that read but break 0.6.6's plan).
        indptr = [0]
        for n in lengths:
            indptr.append(indptr[-1] + n)
        qo_indptr_cpu = torch.tensor(indptr, dtype=torch.int32)  # [B+1]
        last_page_len_cpu = torch.ones(len(sequences), dtype=torch.int32)  # [B]
        mis_kwargs, keep = self._multi_item_params(sequences)
        self._wait_for_previous_plan()
        self.wrapper.plan(
            qo_indptr_cpu, qo_indptr_cpu, self.page_ids_gpu[:total], last_page_len_cpu,
            self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.head_dim, 1,
            causal=True, pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype,
            **mis_kwargs,
        )
        self._plan_issued()
        return keep

    def _multi_item_params(self, sequences: list[PackedSequence]) -> tuple[dict, tuple]:
        if all(s.prefix_len == s.num_tokens for s in sequences):
            return {}, ()  # only plain sequences: the causal mask is enough
        for s in sequences:
            if s.max_item_len > MAX_ITEM_POS:
                raise ValueError(f"an item of {s.max_item_len} tokens exceeds {MAX_ITEM_POS}")
        stride = max(len(s.token_pos_in_items) for s in sequences)
        token_pos = token_pos_rows([s.token_pos_in_items for s in sequences], stride)
        # Fresh pinned tensors each batch, copied without waiting; the kernel reads them on the
        # GPU, so they stay referenced (Step.keep_alive) until the batch finished.
        host = (
            torch.tensor([s.prefix_len for s in sequences], dtype=torch.int64).to(torch.uint32),
            torch.frombuffer(token_pos, dtype=torch.uint16),
            torch.tensor([s.max_item_len for s in sequences], dtype=torch.int32).to(torch.uint16),
        )
        host = tuple(h.pin_memory() for h in host)
        prefix_len_gpu, token_pos_gpu, max_item_len_gpu = (
            h.to(self.device, non_blocking=True) for h in host)
        kwargs = dict(prefix_len_ptr=prefix_len_gpu, token_pos_in_items_ptr=token_pos_gpu,
                      token_pos_in_items_len=stride, max_item_len_ptr=max_item_len_gpu)
        return kwargs, (*host, prefix_len_gpu, token_pos_gpu, max_item_len_gpu)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # K/V as [pages, page_size=1, heads, head_dim] views; the kernel needs one stride for
        # both (CudaOps lays them out so; TorchOps' split views need a copy).
        if k.stride() != v.stride():
            k, v = k.contiguous(), v.contiguous()
        # The kernel writes every output row (a row that may attend to nothing, a delimiter
        # after an empty query, gets a finite value: a GPU test checks), so no zero fill.
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        return self.wrapper.run(q, (k.unsqueeze(1), v.unsqueeze(1)), out=out)


class FlashInferGraphAttention(FlashInferAttention):
    """The same attention for a CUDA-graph bucket of exactly `tokens` rows (gpu_worker/graphs.py).

    A captured kernel reads its metadata from fixed addresses with a fixed batch size, so every
    batch is padded to the bucket: the real sequences, then one plain padding sequence holding
    the rows up to `tokens`, then empty sequences up to `max_sequences + 1`. FlashInfer's CUDA-graph
    mode keeps its indptr buffers fixed and, given the same row total and batch size, plans the
    same tiles, so the launch arguments captured once stay valid; only the buffers change. The
    multi-item parameters live in fixed buffers too, with a row stride of `tokens`.
    Padding rows attend only within the padding sequence and nothing reads them.
    """

    def __init__(self, cfg: ModelConfig, device: torch.device, backend: str, tokens: int,
                 max_sequences: int, workspace_gpu: torch.Tensor) -> None:
        import flashinfer

        self.cfg = cfg
        self.device = device
        self.tokens = tokens
        self.max_sequences = max_sequences
        slots = max_sequences + 1  # + the padding sequence
        self.workspace_gpu = workspace_gpu  # scratch shared by all buckets: one stream runs them
        i32 = dict(dtype=torch.int32, device=device)
        self.page_ids_gpu = torch.arange(tokens, **i32)
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            workspace_gpu, "NHD", backend=backend, use_cuda_graph=True,
            qo_indptr_buf=torch.zeros(slots + 1, **i32),
            paged_kv_indptr_buf=torch.zeros(slots + 1, **i32),
            paged_kv_indices_buf=torch.arange(tokens, **i32),
            paged_kv_last_page_len_buf=torch.ones(slots, **i32))
        self.prefix_len_gpu = torch.zeros(slots, dtype=torch.uint32, device=device)
        self.token_pos_gpu = torch.zeros(slots * tokens, dtype=torch.uint16, device=device)
        self.max_item_len_gpu = torch.zeros(slots, dtype=torch.uint16, device=device)
        self._plan_copied = None

    def plan(self, sequences: list[PackedSequence], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        real = len(sequences)
        lengths = [s.num_tokens for s in sequences]
        padding = self.tokens - sum(lengths)
        lengths += [padding] + [0] * (self.max_sequences - real)
        indptr = [0]
        for n in lengths:
            indptr.append(indptr[-1] + n)
        qo_indptr_cpu = torch.tensor(indptr, dtype=torch.int32)  # [slots + 1]
        last_page_len_cpu = torch.ones(len(lengths), dtype=torch.int32)  # empty: kv length 0
        # The padding sequence is plain (prefix_len = its length); empty ones have no tiles.
        prefix = [s.prefix_len for s in sequences] + [padding] + [0] * (self.max_sequences - real)
        max_item = [s.max_item_len for s in sequences] + [0] * (self.max_sequences + 1 - real)
        # Rows of token positions, `tokens` apart, up to the last sequence with items: a plain
        # sequence (and the padding one) never reads its row, so trailing ones are not written.
        with_items = [s.token_pos_in_items for s in sequences]
        while with_items and not with_items[-1]:
            with_items.pop()
        token_pos = token_pos_rows(with_items, self.tokens)
        host = [torch.tensor(prefix, dtype=torch.int64).to(torch.uint32).pin_memory(),
                torch.tensor(max_item, dtype=torch.int32).to(torch.uint16).pin_memory()]
        self.prefix_len_gpu.copy_(host[0], non_blocking=True)
        self.max_item_len_gpu.copy_(host[1], non_blocking=True)
        if token_pos:  # none when every sequence is plain
            host.append(torch.frombuffer(token_pos, dtype=torch.uint16).pin_memory())
            self.token_pos_gpu[: len(token_pos)].copy_(host[2], non_blocking=True)
        self._wait_for_previous_plan()
        self.wrapper.plan(
            qo_indptr_cpu, qo_indptr_cpu, self.page_ids_gpu, last_page_len_cpu,
            self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.head_dim, 1,
            causal=True, pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype,
            prefix_len_ptr=self.prefix_len_gpu, token_pos_in_items_ptr=self.token_pos_gpu,
            token_pos_in_items_len=self.tokens, max_item_len_ptr=self.max_item_len_gpu,
            # CUDA-graph mode would otherwise always split K/V and merge the parts: one more
            # kernel, and a summation order that differs from the eager path's.
            disable_split_kv=True,
        )
        self._plan_issued()
        return tuple(host)
