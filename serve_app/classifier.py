"""What the scoring routes mean on a sequence-classification model (num_labels classes;
docs/API.md, "Models"). The scorer returns each requested class's logit at an item's score
row, what HF's `*ForSequenceClassification` gives for query + item alone.

/v1/score
- `label_token_ids` are class indices in [0, num_labels), returned in that order; absent means
  every class in order.
- Per item: the raw logits; `apply_softmax: true`: softmax over the listed classes (all of them
  when absent; as on a causal LM, over the listed labels only); `apply_sigmoid: true`: the
  sigmoid of each logit (a one-class reward or relevance score as a probability, or
  multi-label classes). Not both; softmax over one class is always 1, so a one-class model
  refuses it and names apply_sigmoid.
/v1/rerank, /v2/rerank
- relevance = sigmoid(logit) with one class; with two, class 1's softmax probability
  (sigmoid(l1 - l0)): class 1 is the positive class, as in HF's binary classifiers. More
  classes have no single relevance: use /v1/score.
"""

from __future__ import annotations

import math

from serve_app.protocol import ApiError

RERANK_CLASSES = {1: [0], 2: [0, 1]}  # num_labels -> the classes a relevance score reads


def check_class_ids(label_ids: list[int] | None, num_labels: int, max_labels: int) -> list[int]:
    """The requested class indices (all classes when absent); a 400 naming the bad entry."""
    if label_ids is None:
        return list(range(num_labels))
    if not label_ids:
        raise ApiError(400, "label_token_ids must be nonempty, or left out for every class",
                       "label_token_ids")
    if len(label_ids) > max_labels:
        raise ApiError(400, f"label_token_ids has {len(label_ids)} ids; the limit is "
                       f"{max_labels}", "label_token_ids")
    for i, label in enumerate(label_ids):
        if not 0 <= label < num_labels:
            raise ApiError(400, f"label_token_ids[{i}] = {label}: this model is a classifier "
                           f"of {num_labels} classes, so label_token_ids are class indices in "
                           f"[0, {num_labels})", f"label_token_ids[{i}]")
    if len(set(label_ids)) != len(label_ids):
        raise ApiError(400, "label_token_ids must not contain duplicates", "label_token_ids")
    return list(label_ids)


def check_normalisation(apply_softmax: bool, apply_sigmoid: bool, num_labels: int) -> None:
    if apply_softmax and apply_sigmoid:
        raise ApiError(400, "apply_softmax and apply_sigmoid exclude each other; choose one",
                       "apply_sigmoid")
    if apply_softmax and num_labels == 1:
        raise ApiError(400, "apply_softmax over this model's one class is always 1; use "
                       "apply_sigmoid for a probability, or neither for the raw score",
                       "apply_softmax")


def class_scores(logits: list[float], apply_softmax: bool, apply_sigmoid: bool) -> list[float]:
    """One item's scores: the raw logits, their softmax, or the sigmoid of each."""
    if apply_softmax:
        return softmax(logits)
    if apply_sigmoid:
        return [sigmoid(x) for x in logits]
    return list(logits)


def rerank_classes(num_labels: int) -> list[int] | None:
    """The classes a relevance score reads; None when there is no single relevance."""
    return RERANK_CLASSES.get(num_labels)


def classifier_relevance(logits: list[float]) -> float:
    """sigmoid of the one class's logit, or class 1's softmax probability of two."""
    if len(logits) == 1:
        return sigmoid(logits[0])
    negative, positive = logits
    return sigmoid(positive - negative)


def sigmoid(x: float) -> float:
    # Either form alone overflows math.exp for a large |x|.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def softmax(values: list[float]) -> list[float]:
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    total = sum(weights)
    return [w / total for w in weights]
