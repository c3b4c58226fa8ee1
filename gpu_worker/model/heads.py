"""Sequence classifiers (HF's `*ForSequenceClassification`): the same packed decoder forward as
CausalLMForScoring, with HF's `score` head [num_labels, hidden] at the score rows instead of
the LM head (docs/ARCHITECTURE.md, "Classification heads").

HF pools each sequence at its last token, so the head at an item's score row gives what HF
computes for query + item alone. The engine's contract is unchanged: the forward returns
one fp32 value per (score row, label id); for a classifier the label ids are class indices and
the value is that class's logit (nothing over the vocabulary, no normalisation).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import nn

from gpu_worker.forward.batch import ForwardBatch, LoraRows
from gpu_worker.model.decoder import CausalLMForScoring, DecoderModel
from ranker_contract.config import RerankPrompt
from ranker_contract.model_config import ModelConfig


class AdapterHeads:
    """The classification heads of a classifier's LoRA adapters (peft's `modules_to_save`), in
    fp32: slot s's at s, slot 0 the model's own; a slot whose adapter brings none holds the
    model's. Which rows read which adapter is the batch's (LoraRows, gpu_worker/forward/batch.py):
    the rows of an adapter's run read its slot's head; where each row's slot is on the device (a
    CUDA graph, the LoRA kernels) every row picks its own, from one GEMM over all the heads (a
    few classes each)."""

    def __init__(self, head: torch.Tensor, slots: int) -> None:
        self.weights = head.detach().float().unsqueeze(0).repeat(slots + 1, 1, 1)  # [S+1, C, H]

    def put(self, slot: int, head: torch.Tensor | None) -> None:
        """Queued on the stream after every batch launched before, as LoraLinear.put."""
        self.weights[slot].copy_(self.weights[0] if head is None else head, non_blocking=True)

    @staticmethod
    def in_use(lora: LoraRows | None) -> bool:
        return lora is not None and (lora.any_slot or bool(lora.row_runs))

    def logits(self, hidden: torch.Tensor, lora: LoraRows) -> torch.Tensor:
        """[R, C] fp32 logits of the score rows, each row's by its adapter's head."""
        h = hidden.float()
        if lora.any_slot or lora.kernels:
            slots, classes = lora.row_slots, self.weights.shape[1]
            every = torch.nn.functional.linear(h, self.weights.flatten(0, 1))  # [R, (S+1) C]
            picked = slots[:, None] * classes + torch.arange(classes, device=h.device)
            return every.gather(1, picked)
        logits = torch.nn.functional.linear(h, self.weights[0])
        for slot, start, end in lora.row_runs:
            logits[start:end] = torch.nn.functional.linear(h[start:end], self.weights[slot])
        return logits


class SequenceClassifierForScoring(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.num_labels is None:
            raise ValueError("a sequence classifier needs num_labels")
        self.config = cfg
        self.model = DecoderModel(cfg)
        self.score = nn.Linear(cfg.hidden_size, cfg.num_labels, bias=False)  # HF's name, no bias
        self.adapter_heads: AdapterHeads | None = None  # set by an engine with adapter slots

    def forward(self, batch: ForwardBatch, ops) -> torch.Tensor:
        """[N] fp32 class logits gathered at the batch's (label row, class) pairs (the label ids
        are class indices; nothing is normalised over classes). The head runs in fp32: it is
        [R, hidden] x [hidden, classes], negligible next to the decoder, and a bf16 logit
        would round a reward to 3 significant digits."""
        hidden = self.model(batch, ops)  # [R, hidden] at the score rows
        if self.adapter_heads is not None and self.adapter_heads.in_use(batch.lora):
            logits = self.adapter_heads.logits(hidden, batch.lora)
        else:
            logits = torch.nn.functional.linear(hidden.float(), self.score.weight.float())
        return logits[batch.label_rows, batch.label_ids]


def classifier_from_label_rows(lm: CausalLMForScoring, yes_id: int,
                               no_id: int) -> SequenceClassifierForScoring:
    """A causal reranker as a one-class classifier (rerank.classifier_from_labels; vLLM's
    classifier_from_token, from_2_way_softmax): score = (W[yes] - W[no]) . h, so
    sigmoid(score) = P(yes) / (P(yes) + P(no)), today's relevance, and the [R, vocab]
    projection and its log-sum-exp are never computed. The decoder is the same module; the
    head's row is kept in fp32 (the difference of two bf16 rows is exact there)."""
    with torch.device("meta"):
        classifier = SequenceClassifierForScoring(lm.config.with_label_head())
    classifier.model = lm.model
    rows = lm.lm_head.weight.detach()
    row = (rows[yes_id].float() - rows[no_id].float()).unsqueeze(0)  # [1, hidden]
    classifier.score.weight = nn.Parameter(row, requires_grad=False)
    return classifier.eval()


def rerank_label_ids(folder: str | Path, prompt: RerankPrompt) -> tuple[int, int]:
    """The template's yes and no labels as token ids of the folder's tokenizer, one token each,
    resolved as the ingress resolves them (RerankPrompt.label_ids)."""
    tokenizer = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    return prompt.label_ids(lambda label: tokenizer.encode(label, add_special_tokens=False).ids)
