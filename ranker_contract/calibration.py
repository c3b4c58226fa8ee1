"""Calibration maps: a raw relevance score to a probability of relevance (docs/OPERATIONS.md,
"Calibration"). Fitted from labelled rows by ranker_batch/calibration.py, applied by the service
to rerank answers (`calibration:` in the app's config) and by the batch job through it.

Both maps read the raw score's logit z = log(p / (1 - p)), the label logit the model computed:
`platt` is σ(a·z + b); `isotonic` a non-decreasing function of z given by points, linear between
them and flat beyond them. The file is what `python -m ranker_batch.calibrate` writes: per model
or adapter name, under "models", its map under "calibration".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

METHODS = ("platt", "isotonic")
EPS = 1e-12  # probabilities are clipped to [EPS, 1 - EPS] before a logit or a log


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), EPS, 1 - EPS)
    return np.log(p) - np.log1p(-p)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(z, dtype=np.float64)))


@dataclass(frozen=True)
class CalibrationMap:
    """`platt`: params (a, b). `isotonic`: points z and their probabilities y (z increasing)."""

    method: str
    params: tuple[float, float] = (1.0, 0.0)
    z: tuple[float, ...] = field(default=())
    y: tuple[float, ...] = field(default=())

    def apply(self, raw: np.ndarray) -> np.ndarray:
        """Calibrated probabilities of raw relevance scores."""
        z = logit(raw)
        if self.method == "platt":
            a, b = self.params
            return sigmoid(a * z + b)
        return np.interp(z, self.z, self.y)

    def to_json(self) -> dict:
        if self.method == "platt":
            return {"method": "platt", "a": self.params[0], "b": self.params[1]}
        return {"method": "isotonic", "z": list(self.z), "y": list(self.y)}

    @classmethod
    def from_json(cls, doc: dict) -> CalibrationMap:
        if doc["method"] == "platt":
            return cls("platt", (float(doc["a"]), float(doc["b"])))
        if doc["method"] == "isotonic":
            return cls("isotonic", z=tuple(doc["z"]), y=tuple(doc["y"]))
        raise ValueError(f"calibration method must be one of {METHODS}, not {doc['method']!r}")


def load_calibrations(path: Path, served_names: list[str]) -> dict[str, CalibrationMap]:
    """The maps of a calibration file, by the model or adapter name they calibrate; a file that
    cannot be read, or that names a model not served, is a ValueError naming `calibration`."""
    try:
        doc = json.loads(path.read_text())
        maps = {name: CalibrationMap.from_json(entry["calibration"])
                for name, entry in doc["models"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"calibration: {path} is not a calibration file written by "
                         f"python -m ranker_batch.calibrate ({type(exc).__name__}: {exc})"
                         ) from None
    unknown = sorted(set(maps) - set(served_names))
    if unknown:
        raise ValueError(f"calibration: {path} has maps for {unknown}, which are not served "
                         f"here (served: {served_names})")
    return maps
