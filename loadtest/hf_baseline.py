"""HF transformers scoring, the baseline the engine benchmarks compare against.

One sequence per item (query + item, the query recomputed for every item), with HF's best
settings for scoring: no KV cache, logits of the last position only. Used on a GPU in bf16 by
loadtest/bench_engine.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch


class HFBaseline:
    def __init__(self, model_path: str | Path, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        self.model.to(self.device).eval()

    def score(self, sequences: list[list[int]], labels: list[int]) -> list[list[float]]:
        """Label log-probs after each sequence, all in one forward (equal lengths: no padding)."""
        with torch.inference_mode():
            out = self.model(torch.tensor(sequences, device=self.device), use_cache=False,
                             logits_to_keep=1)
            return torch.log_softmax(out.logits[:, -1].float(), dim=-1)[:, labels].tolist()

    def score_request(self, query: list[int], items: list[list[int]], labels: list[int],
                      batched: bool) -> list[list[float]]:
        """One row per item: one forward per item, or (batched) one for all items."""
        seqs = [query + item for item in items]
        groups = [seqs] if batched else [[s] for s in seqs]
        return [row for group in groups for row in self.score(group, labels)]

    def items_per_s(self, requests: list[tuple[list[int], list[list[int]]]], labels: list[int],
                    batch_items: int) -> float:
        """Throughput over every query+item sequence of `requests`, `batch_items` per forward
        (after one unmeasured warm-up batch)."""
        seqs = [query + item for query, items in requests for item in items]
        self.score(seqs[:batch_items], labels)
        started = time.perf_counter()
        for i in range(0, len(seqs), batch_items):
            self.score(seqs[i:i + batch_items], labels)  # .tolist() waits for the device
        return len(seqs) / (time.perf_counter() - started)
