"""Sequence classifiers (HF's `*ForSequenceClassification`): the same packed decoder forward as
CausalLMForScoring, with HF's `score` head [num_labels, hidden] at the score rows instead of
the LM head (docs/ARCHITECTURE.md, "Classification heads").

HF pools each sequence at its last token, so the head at an item's score row gives what HF
computes for query + item alone. The engine's contract is unchanged: `label_logprobs` returns
one fp32 value per (score row, label id); for a classifier the label ids are class indices and
the value is that class's logit (nothing over the vocabulary, no normalisation).
"""

from __future__ import annotations

import torch
from torch import nn

from gpu_worker.model import DecoderModel
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
