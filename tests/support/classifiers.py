"""HF references for classification models served over HTTP: the logits of one sequence, and
the rerank relevance of one document under a built-in rerank template."""

from __future__ import annotations

import math

import torch

from ranker_contract.config import RerankConfig


def hf_logits(hf, ids: list[int]) -> list[float]:
    """`hf`: an AutoModelForSequenceClassification; its logits on `ids` alone."""
    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0].float().tolist()


def reference_relevance(hf, tokenizer, template: str, query: str, document: str) -> float:
    """The head's probability on the template's full prompt of `query` and `document`: the
    sigmoid of one class, or class 1's softmax probability of two."""
    prompt = RerankConfig(template=template).resolved_prompt()
    text = (prompt.prefix.replace("{instruction}", prompt.default_instruction)
            .replace("{query}", query) + prompt.document.replace("{document}", document)
            + prompt.suffix)
    logits = hf_logits(hf, tokenizer(text)["input_ids"])
    if len(logits) == 1:
        return 1 / (1 + math.exp(-logits[0]))
    return math.exp(logits[1]) / (math.exp(logits[0]) + math.exp(logits[1]))  # class 1
