"""CUDA graphs of the whole forward (embedding → layers → score rows → label log-probs) for
small batches, where the eager launches of a forward cost more host time than its GPU work.

One graph per (token bucket, score-row bucket), captured at start-up, largest first, into one
shared memory pool. A batch is padded up to the smallest bucket that holds it: padding tokens go
into an attention request of their own
(gpu_worker/attention/flashinfer.py::FlashInferGraphAttention), padding score rows and label
entries point at row 0 / token 0, and only the first N outputs are read back. Delimiter
positions come from the ingress, never from token values, so padding cannot create false item
boundaries. Larger batches run eagerly (docs/ARCHITECTURE.md, "CUDA graphs").

Each graph is captured on a ForwardBatch (gpu_worker/forward/batch.py) over fixed input tensors:
a replay copies the batch's inputs into them and rewrites the attention's buffers. With LoRA
adapter slots (gpu_worker/model/lora.py), each bucket is captured twice on the same inputs: as the
model alone, which batches of the model alone replay, and through the LoRA kernels
(gpu_worker/kernels/lora.py), whose inputs include each token's and each score row's slot
(padding: 0, none), which any batch with an adapter replays.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from gpu_worker.attention.flashinfer import (
    WORKSPACE_BYTES,
    FlashInferGraphAttention,
    widest_tile_above,
)
from gpu_worker.forward.batch import ForwardBatch, LoraRows
from gpu_worker.forward.host_tensors import padded_int64_tensor
from gpu_worker.model.decoder import CausalLMForScoring, Ops
from ranker_contract.packing import PackedSequence

logger = logging.getLogger(__name__)

ROW_BUCKETS = (16, 64, 256)  # score rows (items) per captured batch
LABELS_PER_ROW = 4  # label entries per score row a captured batch has room for


@dataclass
class _Graph:
    tokens: int
    rows: int
    labels: int
    attention: FlashInferGraphAttention
    # int64 [2 * tokens + rows + 2 * labels (+ tokens + rows with LoRA)]: the inputs, one copy
    # per batch
    meta: torch.Tensor
    out: torch.Tensor  # [labels] fp32 label log-probs (the first N are the batch's)
    graph: torch.cuda.CUDAGraph
    lora_graph: torch.cuda.CUDAGraph | None  # the same through the LoRA kernels; out the same


class CudaGraphs:
    def __init__(self, model: CausalLMForScoring, ops: Ops, token_buckets: list[int],
                 dtype: torch.dtype, device: torch.device, lora: bool = False) -> None:
        """`lora`: also capture each bucket through the LoRA kernels (every LoRA linear of the
        model has them)."""
        started = time.perf_counter()
        free_before, _ = torch.cuda.mem_get_info()
        self.dtype = dtype
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        pool = torch.cuda.graph_pool_handle()
        self.graphs: list[_Graph] = []
        cfg = model.config
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        for tokens in sorted(token_buckets, reverse=True):  # largest first: the pool is reused
            # Every sequence has a score row per item and one attention block more than it has
            # items, so `rows` items make at most 2 * rows blocks; the query rows each block
            # after the first reads are at most `tokens`, for at most `rows` blocks. A bucket
            # whose plan would take a narrower tile than eager batches is left out: a batch of
            # that many items in so few tokens takes a larger one (widest_tile_above).
            for rows in sorted((r for r in ROW_BUCKETS if r <= tokens
                                and (tokens - 2 * r) * group > widest_tile_above(
                                    cfg.head_dim)), reverse=True):
                attention = FlashInferGraphAttention(cfg, device, tokens, items=rows,
                                                     max_requests=2 * rows,
                                                     kv_capacity=tokens * (rows + 1),
                                                     workspace_gpu=workspace)
                self.graphs.append(_capture(model, ops, attention, tokens, rows, dtype, pool,
                                            device, lora))
        self.graphs.sort(key=lambda g: (g.tokens, g.rows))
        torch.cuda.synchronize()
        used = free_before - torch.cuda.mem_get_info()[0]
        self.lora = lora
        logger.info("captured %d CUDA graphs (token buckets %s, row buckets %s%s) in %.1f s, "
                    "%.0f MiB", len(self.graphs), sorted(token_buckets), ROW_BUCKETS,
                    ", each also with LoRA" if lora else "", time.perf_counter() - started,
                    used / 2**20)

    def pick(self, sequences: list[PackedSequence], rows: int, labels: int) -> _Graph | None:
        """The smallest captured graph that holds the batch, or None (run it eagerly)."""
        tokens = sum(s.num_tokens for s in sequences)
        for g in self.graphs:  # its attention buffers hold any batch of g.tokens and g.rows
            if tokens <= g.tokens and rows <= g.rows and labels <= g.labels:
                return g
        return None

    def launch(self, g: _Graph, sequences: list[PackedSequence], input_ids: list[int],
               positions: list[int], score_rows: list[int], label_rows: list[int],
               label_ids: list[int], lora_slots: tuple[list[int], list[int]] | None = None
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Queue the batch on graph `g`: returns (its [N] log-probs, tensors to keep alive).
        `lora_slots`: each token's and each score row's adapter slot (the LoRA graph), or None
        (the model alone)."""
        lists = [(input_ids, g.tokens), (positions, g.tokens), (score_rows, g.rows),
                 (label_rows, g.labels), (label_ids, g.labels)]
        if g.lora_graph is not None:  # slots 0 (none) where the model alone replays
            token_slots, row_slots = lora_slots or ([], [])
            lists += [(token_slots, g.tokens), (row_slots, g.rows)]
        host = padded_int64_tensor(lists, pin=True)
        g.meta.copy_(host, non_blocking=True)
        keep = g.attention.plan(sequences, self.dtype)
        (g.graph if lora_slots is None else g.lora_graph).replay()
        return g.out[: len(label_ids)], (host, *keep)


def _capture(model: CausalLMForScoring, ops: Ops, attention: FlashInferGraphAttention,
             tokens: int, rows: int, dtype: torch.dtype, pool, device: torch.device,
             lora: bool) -> _Graph:
    labels = rows * LABELS_PER_ROW
    sizes = [tokens, tokens, rows, labels, labels] + ([tokens, rows] if lora else [])
    meta = torch.zeros(sum(sizes), dtype=torch.int64, device=device)
    ids, positions, score_rows, label_rows, label_ids, *slots = meta.split(sizes)
    # all padding: the shapes are what matter
    attention.plan([], dtype)
    alone = ForwardBatch(ids, positions, score_rows, label_rows, label_ids, attention)

    def capture(run) -> torch.cuda.CUDAGraph:
        side = torch.cuda.Stream()  # warm-up (Triton/JIT compiles, allocator) off the capture
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another engine of the process (a model loading beside this one, or this
        # one loading beside another's running batches) may sync or allocate in its own thread
        # meanwhile; the default, global, would fail those calls.
        with torch.inference_mode(), torch.cuda.graph(graph, pool=pool,
                                                      capture_error_mode="thread_local"):
            run()
        return graph

    captured = {}  # the output of the forward the graph holds

    def the_model_alone() -> None:
        captured["out"] = model(alone, ops)

    graph = capture(the_model_alone)
    out = captured["out"]
    lora_graph = None
    if lora:  # the same inputs and output, every linear through the kernels
        token_slots, row_slots = slots
        with_lora = ForwardBatch(ids, positions, score_rows, label_rows, label_ids, attention,
                                 LoraRows(kernels=True, token_slots=token_slots,
                                          row_slots=row_slots, any_slot=True))
        lora_graph = capture(lambda: out.copy_(model(with_lora, ops)))
    return _Graph(tokens, rows, labels, attention, meta, out, graph, lora_graph)
