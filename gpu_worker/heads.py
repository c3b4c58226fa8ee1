"""Sequence classifiers (HF's `*ForSequenceClassification`): the same packed decoder forward as
CausalLMForScoring, with HF's `score` head [num_labels, hidden] at the score rows instead of
the LM head (docs/ARCHITECTURE.md, "Classification heads").

HF pools each sequence at its last token, so the head at an item's score row gives what HF
computes for query + item alone. The engine's contract is unchanged: `label_logprobs` returns
one fp32 value per (score row, label id); for a classifier the label ids are class indices and
the value is that class's logit (nothing over the vocabulary, no normalisation).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import nn

from gpu_worker.model import CausalLMForScoring, DecoderModel
from ranker_contract.config import RerankPrompt
from ranker_contract.model_config import ModelConfig


class SequenceClassifierForScoring(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.num_labels is None:
            raise ValueError("a sequence classifier needs num_labels")
        self.config = cfg
        self.model = DecoderModel(cfg)
        self.score = nn.Linear(cfg.hidden_size, cfg.num_labels, bias=False)  # HF's name, no bias

    def label_logprobs(
        self,
        hidden: torch.Tensor,  # [R, hidden] at the score rows
        label_rows: torch.Tensor,  # [N] int64: which score row each output belongs to
        label_ids: torch.Tensor,  # [N] int64: which class
    ) -> torch.Tensor:
        """[N] fp32 class logits gathered at (row, class). The head runs in fp32: it is
        [R, hidden] x [hidden, classes], negligible next to the decoder, and a bf16 logit
        would round a reward to 3 significant digits."""
        logits = torch.nn.functional.linear(hidden.float(), self.score.weight.float())  # [R, C]
        return logits[label_rows, label_ids]


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
