"""Request bodies and arrival schedules for the /v1/score load generator.

Bodies carry token ids, not text: every request draws fresh random ids from a seeded RNG, so no
two requests are alike (nothing can be served from a cache) and runs are reproducible.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Workload:
    """Shape of one /v1/score request; token ids are uniform in [0, vocab)."""

    query_len: int = 120
    items: int = 10
    item_len: int = 180
    labels: tuple[int, ...] = (9454, 2753)
    vocab: int = 151643
    apply_softmax: bool = False

    def __post_init__(self) -> None:
        if self.query_len < 0 or self.items < 1 or self.item_len < 0:
            raise ValueError("need query_len >= 0, items >= 1, item_len >= 0")
        if self.query_len == 0 and self.item_len == 0:
            raise ValueError("an empty query with empty items is rejected by the service")
        if self.vocab < 1 or not self.labels or any(not 0 <= t < self.vocab for t in self.labels):
            raise ValueError(f"labels {self.labels} must be non-empty and in [0, {self.vocab})")

    @property
    def tokens_per_request(self) -> int:
        return self.query_len + self.items * self.item_len

    def describe(self) -> dict:
        d = asdict(self)
        d["labels"] = list(self.labels)
        d["tokens_per_request"] = self.tokens_per_request
        return d


@dataclass
class RequestFactory:
    """Makes serialized request bodies, each with fresh random token ids from one seeded RNG."""

    workload: Workload
    seed: int | str = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"content:{self.seed}")
        self._population = range(self.workload.vocab)

    def body(self) -> dict:
        w, rng, pop = self.workload, self._rng, self._population
        return {
            "query": rng.choices(pop, k=w.query_len),
            "items": [rng.choices(pop, k=w.item_len) for _ in range(w.items)],
            "label_token_ids": list(w.labels),
            "apply_softmax": w.apply_softmax,
        }

    def next_bytes(self) -> bytes:
        return json.dumps(self.body(), separators=(",", ":")).encode()


ARRIVALS = ("poisson", "constant")


def arrival_offsets(kind: str, rate: float, horizon_s: float, seed: int | str = 0) -> list[float]:
    """Send times in seconds from the start, all in [0, horizon_s), for `rate` requests/s.

    poisson: exponential gaps of mean 1/rate (seeded); constant: exactly i / rate.
    """
    if rate <= 0 or horizon_s < 0:
        raise ValueError("rate must be > 0 and horizon_s >= 0")
    if kind == "constant":
        n = math.ceil(horizon_s * rate) + 1
        return [i / rate for i in range(n) if i / rate < horizon_s]
    if kind != "poisson":
        raise ValueError(f"arrival kind must be one of {ARRIVALS}, got {kind!r}")
    rng = random.Random(f"arrivals:{seed}")
    out, t = [], rng.expovariate(rate)
    while t < horizon_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out
