"""Request contents and arrival schedules for the load generator and the benchmarks.

By default requests carry token ids: every request draws fresh random ids from a seeded RNG, so
no two requests are alike (nothing can be served from a cache) and runs are reproducible. With
`Workload(text=...)` they carry strings instead, which exercises the ingress's tokenizer:

- "repeat" (SGLang bench_score style): the query is REPEAT_TOKEN × query_len and every item
  REPEAT_TOKEN × item_len. REPEAT_TOKEN is "<|im_start|>", one special token in the Qwen and
  SmolLM2 tokenizers, so the lengths are exact there. Every request is the same text.
- "natural": words drawn with the seeded RNG from WORDS (common English words of varied length,
  joined by spaces). Each query/item gets round(U(0.75, 1.25) × length) words; a word is one
  token in the SmolLM2 tokenizer (1.00 tokens per word measured over 500 items), so token counts
  vary over about ±25% around query_len/item_len, and every request differs.

With `query_repeats` = k > 1 each query (ids or text) is sent k times, every time with fresh
items, its repeats spread over about `repeat_window_s` at the offered rate: what a scorer's
prefix cache serves (docs/ARCHITECTURE.md, "Prefix cache"). PRESETS names the shapes the prefix
benchmark uses.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field

TEXT_MODES = ("repeat", "natural")
REPEAT_TOKEN = "<|im_start|>"
WORDS = tuple("""
the of and to in is that it was for on are as with his they at be this have from or one had by
word but not what all were we when your can said there use an each which she do how their if will
up other about out many then them these so some her would make like him into time has look two
more write go see number no way could people my than first water been call who oil its now find
long down day did get come made may part over new sound take only little work know place year
live me back give most very after thing our just name good sentence man think say great where help
through much before line right too mean old any same tell boy follow came want show also around
form three small set put end does another well large must big even such because turn here why ask
went men read need land different home us move try kind hand picture again change off play spell
air away animal house point page letter mother answer found study still learn should america world
measurement infrastructure nevertheless photosynthesis approximately extraordinary responsibility
international characteristics unfortunately neighbourhood refrigerator temperature environmental
""".split())


@dataclass(frozen=True)
class Workload:
    """Shape of one /v1/score request (or /v1/rerank with `rerank`: the query and the items
    as documents, text only); token ids are uniform in [0, vocab)."""

    query_len: int = 120
    items: int = 10
    item_len: int = 180
    labels: tuple[int, ...] = (9454, 2753)
    vocab: int = 151643
    apply_softmax: bool = False
    text: str | None = None  # None: token ids; "repeat" or "natural": strings (module doc)
    rerank: bool = False  # POST /v1/rerank {query, documents} instead of /v1/score
    query_repeats: int = 1  # each query sent this many times (module doc)
    repeat_window_s: float = 1.0  # ...within about this long, at the rate the factory is given
    model: str | None = None  # the request's `model` (an adapter's name); None: not sent

    def __post_init__(self) -> None:
        if self.query_len < 0 or self.items < 1 or self.item_len < 0:
            raise ValueError("need query_len >= 0, items >= 1, item_len >= 0")
        if self.query_len == 0 and self.item_len == 0:
            raise ValueError("an empty query with empty items is rejected by the service")
        if self.vocab < 1 or not self.labels or any(not 0 <= t < self.vocab for t in self.labels):
            raise ValueError(f"labels {self.labels} must be non-empty and in [0, {self.vocab})")
        if self.text not in (None, *TEXT_MODES):
            raise ValueError(f"text must be None or one of {TEXT_MODES}, got {self.text!r}")
        if self.rerank and self.text is None:
            raise ValueError("rerank sends documents as text: choose a text mode")
        if self.query_repeats < 1 or self.repeat_window_s <= 0:
            raise ValueError("need query_repeats >= 1 and repeat_window_s > 0")

    @property
    def path(self) -> str:
        return "/v1/rerank" if self.rerank else "/v1/score"

    @property
    def result_key(self) -> str:
        """The response's list with one entry per item."""
        return "results" if self.rerank else "scores"

    @property
    def tokens_per_request(self) -> int:
        """Nominal: exact for token ids and "repeat", about this for "natural"."""
        return self.query_len + self.items * self.item_len

    def describe(self) -> dict:
        d = asdict(self)
        d["labels"] = list(self.labels)
        d["tokens_per_request"] = self.tokens_per_request
        return d


# name → the request shape of the prefix benchmark (loadtest/bench_prefix.py)
PRESETS = {
    # a user's profile and history re-ranked against candidates from several sources
    "profile": dict(query_len=2000, items=20, item_len=50, query_repeats=4),
    # a search question re-ranked over several pages of documents
    "pages": dict(query_len=120, items=10, item_len=180, query_repeats=5),
    # the standard bench: nothing repeats
    "standard": dict(query_len=120, items=10, item_len=180),
}


@dataclass
class RequestFactory:
    """Makes request contents, fresh for every call, from one RNG seeded by `seed`. `rate`
    (requests/s offered) spreads a repeated query over the workload's repeat window."""

    workload: Workload
    seed: int | str = 0
    rate: float | None = None
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"content:{self.seed}")
        self._population = range(self.workload.vocab)
        w = self.workload
        # Queries sent in turn: a query's k repeats then span about k × open / rate seconds.
        self._open_size = (max(1, round(self.rate * w.repeat_window_s / w.query_repeats))
                           if self.rate and w.query_repeats > 1 else 1)
        self._open: list[list] = []  # [query, repeats left]

    def _query(self, make):
        """A query: a new one from `make()`, or a repeat of an open one."""
        if self.workload.query_repeats == 1:
            return make()
        if len(self._open) < self._open_size:
            self._open.append([make(), self.workload.query_repeats])
        entry = self._rng.choice(self._open)
        entry[1] -= 1
        if entry[1] == 0:
            self._open.remove(entry)
        return entry[0]

    def token_ids(self) -> tuple[list[int], list[list[int]]]:
        """(query, items) as random token ids; the engine benchmarks score these directly."""
        w, rng, pop = self.workload, self._rng, self._population
        query = self._query(lambda: rng.choices(pop, k=w.query_len))
        return query, [rng.choices(pop, k=w.item_len) for _ in range(w.items)]

    def texts(self) -> tuple[str, list[str]]:
        """(query, items) as strings in the workload's text mode."""
        w = self.workload
        if w.text == "repeat":
            return REPEAT_TOKEN * w.query_len, [REPEAT_TOKEN * w.item_len] * w.items
        query = self._query(lambda: self._words(w.query_len))
        return query, [self._words(w.item_len) for _ in range(w.items)]

    def _words(self, tokens: int) -> str:
        n = round(self._rng.uniform(0.75, 1.25) * tokens)
        return " ".join(self._rng.choices(WORDS, k=n))

    def body(self) -> dict:
        w = self.workload
        query, items = self.texts() if w.text else self.token_ids()
        named = {"model": w.model} if w.model else {}
        if w.rerank:
            return {"query": query, "documents": items} | named
        return {"query": query, "items": items, "label_token_ids": list(w.labels),
                "apply_softmax": w.apply_softmax} | named

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
