"""Fitting calibration maps (ranker_contract/calibration.py) from labelled rows, and the metrics of
calibration (python -m ranker_batch.calibrate; docs/OPERATIONS.md, "Calibration").

`platt` is the maximum-likelihood fit (Newton's method on the log-loss); `isotonic` is
pool-adjacent-violators on the labels ordered by the label logit, for a relation that is
monotone but not logistic. Labels are 0/1, or graded in [0, 1] (say, the share of raters who
found the item relevant): both fits take them as soft targets. The metrics say how well
probabilities match outcomes: expected calibration error over ECE_BINS equal-width bins, the
Brier score and the log-loss.
"""

from __future__ import annotations

import numpy as np

from ranker_contract.calibration import EPS, METHODS, CalibrationMap, logit, sigmoid

ECE_BINS = 15
NEWTON_STEPS, NEWTON_TOL = 100, 1e-10


def fit(raw: np.ndarray, labels: np.ndarray, method: str) -> CalibrationMap:
    """The map of `method` fitted to raw relevance scores and their labels (in [0, 1])."""
    raw, labels = np.asarray(raw, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    if raw.shape != labels.shape or raw.ndim != 1 or raw.size < 2:
        raise ValueError("fit needs two or more scores with one label each")
    if np.any((labels < 0) | (labels > 1)):
        raise ValueError("labels must lie in [0, 1]")
    if method == "platt":
        return CalibrationMap("platt", _platt(logit(raw), labels))
    if method == "isotonic":
        z, y = _isotonic(logit(raw), labels)
        return CalibrationMap("isotonic", z=z, y=y)
    raise ValueError(f"method must be one of {METHODS}, not {method!r}")


def _platt(z: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, b) of σ(a·z + b) with the least log-loss and a ≥ 0: a map must not reverse the
    model's order (a reranker answers sorted by it). Where the best a is negative, the raw
    scores rank against the labels and a = 0, the base rate, is the best that keeps order."""
    base_rate = 0.0, float(logit(np.mean(y)))
    if not np.any(y > 0) or not np.any(y < 1):  # one class only: no slope to fit
        return base_rate
    x = np.stack([z, np.ones_like(z)], axis=1)
    theta = np.array([1.0, 0.0])
    for _ in range(NEWTON_STEPS):
        p = sigmoid(x @ theta)
        gradient = x.T @ (p - y)
        hessian = x.T @ (x * (p * (1 - p))[:, None]) + 1e-9 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        theta -= step
        if np.max(np.abs(step)) < NEWTON_TOL:
            break
    return base_rate if theta[0] < 0 else (float(theta[0]), float(theta[1]))


def _isotonic(z: np.ndarray, y: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Pool-adjacent-violators on y ordered by z; each pooled block gives two points, at its
    lowest and its highest z, so the map is flat inside a block and linear between blocks."""
    order = np.argsort(z, kind="stable")
    z, y = z[order], y[order]
    blocks: list[list[float]] = []  # [sum of y, count, lowest z, highest z]
    for zi, yi in zip(z, y):
        blocks.append([yi, 1.0, zi, zi])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] >= blocks[-1][0] / blocks[-1][1]:
            total, count, _, high = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
            blocks[-1][3] = high
    points_z, points_y = [], []
    for total, count, low, high in blocks:
        for point in ((low,) if low == high else (low, high)):
            points_z.append(float(point))
            points_y.append(float(total / count))
    return tuple(points_z), tuple(points_y)


def metrics(probabilities: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """ECE (ECE_BINS equal-width bins of the probability), Brier score, log-loss."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), EPS, 1 - EPS)
    y = np.asarray(labels, dtype=np.float64)
    bins = np.minimum((p * ECE_BINS).astype(int), ECE_BINS - 1)
    ece = 0.0
    for b in range(ECE_BINS):
        inside = bins == b
        if inside.any():
            ece += inside.mean() * abs(y[inside].mean() - p[inside].mean())
    return {"ece": float(ece), "brier": float(np.mean((p - y) ** 2)),
            "log_loss": float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))}
