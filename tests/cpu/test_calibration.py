"""Calibration maps recover known relations from labels drawn from them, and the metrics match
their definitions (ranker_batch/calibration.py)."""

import math

import numpy as np
import pytest

from ranker_batch.calibration import CalibrationMap, fit, metrics

A, B = 0.6, -0.8  # the known logistic map of the label logit


def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


def _draw(n: int, seed: int, truth):
    """Raw scores with logits ~ N(0, 2²) and 0/1 labels drawn from truth(logit)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.0, n)
    return _sigmoid(z), (rng.random(n) < truth(z)).astype(float)


def test_platt_recovers_a_known_logistic_map_within_10_percent():
    raw, labels = _draw(100_000, 0, lambda z: _sigmoid(A * z + B))
    cal = fit(raw, labels, "platt")
    a, b = cal.params
    assert abs(a - A) <= 0.1 * abs(A) and abs(b - B) <= 0.1 * abs(B), cal.params
    held_raw, held_labels = _draw(20_000, 1, lambda z: _sigmoid(A * z + B))
    before, after = metrics(held_raw, held_labels), metrics(cal.apply(held_raw), held_labels)
    assert after["ece"] <= 0.02 < before["ece"], (before, after)
    assert after["log_loss"] < before["log_loss"] and after["brier"] < before["brier"]


def test_graded_labels_are_soft_targets():
    # labels equal to the true probabilities: the fit is the map itself
    rng = np.random.default_rng(2)
    z = rng.normal(0.0, 2.0, 2_000)
    cal = fit(_sigmoid(z), _sigmoid(A * z + B), "platt")
    assert cal.params == pytest.approx((A, B), abs=1e-6)


def test_scores_that_rank_against_the_labels_get_the_base_rate_never_a_reversed_order():
    # labels drawn from a decreasing map: the best slope is negative, which would reverse the
    # model's ranking; the order-keeping best is the flat map at the base rate
    raw, labels = _draw(20_000, 3, lambda z: _sigmoid(-A * z + B))
    a, b = fit(raw, labels, "platt").params
    assert a == 0.0 and b == pytest.approx(math.log(labels.mean() / (1 - labels.mean())))
    assert fit(raw, np.ones_like(raw), "platt").params[0] == 0.0  # one class: no slope


def test_isotonic_fits_a_monotone_map_that_is_not_logistic():
    def truth(z):  # a step, then a plateau: no logistic map fits it
        return np.where(z < -1, 0.05, np.where(z < 1.5, 0.5, 0.9))

    raw, labels = _draw(50_000, 3, truth)
    held_raw, held_labels = _draw(20_000, 4, truth)
    isotonic = metrics(fit(raw, labels, "isotonic").apply(held_raw), held_labels)
    platt = metrics(fit(raw, labels, "platt").apply(held_raw), held_labels)
    assert isotonic["ece"] <= 0.03 and isotonic["log_loss"] < platt["log_loss"], (isotonic, platt)
    probabilities = fit(raw, labels, "isotonic").apply(np.sort(held_raw))
    assert np.all(np.diff(probabilities) >= 0)  # monotone


def test_the_metrics_by_their_definitions():
    got = metrics(np.array([0.2, 0.8]), np.array([0.0, 1.0]))
    assert got["brier"] == pytest.approx(0.04)  # (0.2² + 0.2²) / 2
    assert got["log_loss"] == pytest.approx(-math.log(0.8))
    assert got["ece"] == pytest.approx(0.2)  # two bins of half the rows, each off by 0.2
    assert metrics(np.array([0.3, 0.3, 0.3]), np.array([0.0, 1.0, 0.0]))["ece"] == \
        pytest.approx(abs(1 / 3 - 0.3))  # one bin: its mean label against its mean probability


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_a_map_survives_its_json(method):
    raw, labels = _draw(2_000, 5, lambda z: _sigmoid(A * z + B))
    cal = fit(raw, labels, method)
    again = CalibrationMap.from_json(cal.to_json())
    assert np.array_equal(again.apply(raw), cal.apply(raw))


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="labels"):
        fit(np.array([0.1, 0.9]), np.array([0.0, 2.0]), "platt")
    with pytest.raises(ValueError, match="method"):
        fit(np.array([0.1, 0.9]), np.array([0.0, 1.0]), "histogram")
    with pytest.raises(ValueError, match="two or more"):
        fit(np.array([0.1]), np.array([1.0]), "platt")
