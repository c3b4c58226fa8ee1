"""Per-key quotas (docs/OPERATIONS.md, "Quotas"): requests and tokens per minute for each API
key, counted for the whole cluster.

A key's quota is written beside it in the key file or variable (`search:<key> rpm=600
tpm=2000000`; serve_app/auth.py reads it). One QuotaLedger replica (serve_app/quota_ledger.py)
holds every key's use over the last 60 seconds, so every ingress replica, on every node, draws
on the same count, and an ingress replica that restarts finds it where it was. Each request of a
key with a quota costs one call to the ledger, after packing (when its tokens are known, as the
response's `usage` counts them); a key without one costs nothing. A refused key is refused by
its ingress replica alone, before its body is read, until the wait the ledger named has passed:
traffic far over a quota does not reach the ledger. An admitted request that no scorer
answers (refused with 503, past its deadline, its client gone) is given back to the key: only
what was scored counts.

Over quota: 429 in the error envelope with `Retry-After` (whole seconds, 1 to 60) and
`retry-after-ms`, which the Cohere and OpenAI clients honour. A request larger than its key's
whole minute of tokens can never pass: 413, naming the quota.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from dataclasses import dataclass

from serve_app.protocol import ApiError

logger = logging.getLogger(__name__)

WINDOW_S = 60  # quotas are per minute, counted over the last 60 seconds (a sliding window)
QUOTA_FIELDS = {"rpm": "requests_per_minute", "tpm": "tokens_per_minute"}
LEDGER_TIMEOUT_S = 2.0  # past this the ledger counts as lost: the request is admitted


@dataclass(frozen=True, slots=True)
class Quota:
    """A key's limits; None: no limit of that kind."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    @property
    def limited(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None


NO_QUOTA = Quota()


def parse_quota(fields: list[str], where: str) -> Quota:
    """The quota from a key entry's `rpm=N` / `tpm=N` fields; ValueError naming `where`."""
    limits: dict[str, int] = {}
    for number, field in enumerate(fields, 1):
        name, _, value = field.partition("=")
        if name not in QUOTA_FIELDS or not value.isdigit() or int(value) < 1:
            # not quoted: a stray field may be (part of) a key
            raise ValueError(f"{where}: field {number} after the key is not a quota "
                             "(rpm=N or tpm=N, N ≥ 1)")
        if QUOTA_FIELDS[name] in limits:
            raise ValueError(f"{where}: {name} is given twice")
        limits[QUOTA_FIELDS[name]] = int(value)
    return Quota(**limits)


class _Window:
    """One key's use of one kind (requests or tokens) over the last WINDOW_S seconds, in
    one-second buckets."""

    def __init__(self) -> None:
        self.buckets: deque[list[int]] = deque()  # [second, amount], oldest first
        self.total = 0

    def expire(self, second: int) -> None:
        while self.buckets and self.buckets[0][0] <= second - WINDOW_S:
            self.total -= self.buckets.popleft()[1]

    def wait_s(self, amount: int, limit: int, now: float) -> float:
        """0 when `amount` fits under `limit` now, else the seconds until it does."""
        if self.total + amount <= limit:
            return 0.0
        freed = 0
        for second, used in self.buckets:
            freed += used
            if self.total - freed + amount <= limit:
                return max(second + WINDOW_S - now, 0.001)
        return math.inf  # larger than the limit itself (QuotaWindows.take refuses it first)

    def add(self, amount: int, second: int) -> None:
        if self.buckets and self.buckets[-1][0] == second:
            self.buckets[-1][1] += amount
        else:
            self.buckets.append([second, amount])
        self.total += amount

    def give_back(self, amount: int, second: int) -> None:
        """Take `amount` out of the bucket of `second` (where it was added), if that second is
        still in the window."""
        for bucket in self.buckets:
            if bucket[0] == second:
                returned = min(amount, bucket[1])
                bucket[1] -= returned
                self.total -= returned
                return


@dataclass(frozen=True, slots=True)
class Charge:
    """An admitted request's count in the ledger, as a refund names it."""

    key_id: str
    quota: Quota
    tokens: int
    second: int


@dataclass(frozen=True, slots=True)
class Taken:
    """The ledger's answer: admitted (wait_s 0), or the seconds until the request would fit."""

    wait_s: float
    kind: str = ""  # what is exhausted: "requests_per_minute" or "tokens_per_minute"
    second: int = 0  # admitted: the second it was counted in (what a refund names)


class QuotaWindows:
    """Every key's use over the last WINDOW_S seconds, and the admission rule: a request is
    admitted when its one request and its tokens both fit under its key's limits, and counted
    only then. Torch- and Ray-free; the clock is given, for tests."""

    def __init__(self, clock=time.time) -> None:
        self.clock = clock
        self._windows: dict[tuple[str, str], _Window] = {}

    def _window(self, key: str, kind: str) -> _Window:
        window = self._windows.get((key, kind))
        if window is None:
            window = self._windows[(key, kind)] = _Window()
        window.expire(int(self.clock()))
        return window

    def take(self, key: str, quota: Quota, tokens: int) -> Taken:
        now = self.clock()
        asked = (("requests_per_minute", 1, quota.requests_per_minute),
                 ("tokens_per_minute", tokens, quota.tokens_per_minute))
        wait = Taken(0.0)
        for kind, amount, limit in asked:
            if limit is not None:
                kind_wait = self._window(key, kind).wait_s(amount, limit, now)
                if kind_wait > wait.wait_s:
                    wait = Taken(kind_wait, kind)
        if wait.wait_s == 0:
            for kind, amount, limit in asked:
                if limit is not None:
                    self._window(key, kind).add(amount, int(now))
            return Taken(0.0, second=int(now))
        return wait

    def refund(self, key: str, quota: Quota, tokens: int, second: int) -> None:
        """Give back a request admitted in `second` that was not scored."""
        for kind, amount, limit in (("requests_per_minute", 1, quota.requests_per_minute),
                                    ("tokens_per_minute", tokens, quota.tokens_per_minute)):
            if limit is not None:
                self._window(key, kind).give_back(amount, second)

    def usage(self, key: str, quota: Quota) -> dict:
        """The key's limits, what is left of each now, and when all of it is back."""
        now = self.clock()
        out = {}
        for kind, limit in (("requests_per_minute", quota.requests_per_minute),
                            ("tokens_per_minute", quota.tokens_per_minute)):
            if limit is None:
                out[kind] = None
                continue
            window = self._window(key, kind)
            reset = window.buckets[-1][0] + WINDOW_S - now if window.buckets else 0.0
            out[kind] = {"limit": limit, "remaining": max(limit - window.total, 0),
                         "reset_s": round(max(reset, 0.0), 3)}
        return out


def over_quota(key_id: str, wait_s: float, kind: str) -> ApiError:
    retry_after = min(max(math.ceil(wait_s), 1), WINDOW_S)
    return ApiError(429, f"API key {key_id!r} is over its {kind} quota; retry in "
                    f"{retry_after} s", param=kind,
                    headers={"Retry-After": str(retry_after),
                             "retry-after-ms": str(max(int(wait_s * 1e3), 1))})


def larger_than_quota(key_id: str, tokens: int, limit: int) -> ApiError:
    return ApiError(413, f"this request's {tokens} tokens exceed API key {key_id!r}'s whole "
                    f"tokens_per_minute quota ({limit}); send fewer items a request",
                    param="tokens_per_minute")


class Quotas:
    """An ingress replica's side of the quotas: the ledger's handle, and the keys it has been
    told are over quota, refused here until their wait has passed."""

    def __init__(self, ledger, clock=time.monotonic) -> None:
        self.ledger = ledger  # a DeploymentHandle of QuotaLedger (None: auth off, no quotas)
        self.clock = clock
        self._refused_until: dict[str, tuple[float, str]] = {}
        self._sent: set[asyncio.Task] = set()  # refunds on their way (asyncio keeps weak refs)

    def refuse_early(self, key_id: str) -> None:
        """429 for a key this replica was told is over quota, while its wait lasts."""
        until = self._refused_until.get(key_id)
        if until is None:
            return
        wait_s = until[0] - self.clock()
        if wait_s > 0:
            raise over_quota(key_id, wait_s, until[1])
        del self._refused_until[key_id]

    async def take(self, key_id: str, quota: Quota, tokens: int) -> Charge | None:
        """Count one request of `tokens` against the key's quota, or raise 429 (413 when it
        could never fit). Returns what was counted (None: nothing), for `refund`."""
        if not quota.limited or self.ledger is None:
            return None
        if quota.tokens_per_minute is not None and tokens > quota.tokens_per_minute:
            raise larger_than_quota(key_id, tokens, quota.tokens_per_minute)
        asked = asyncio.ensure_future(asyncio.wait_for(
            self.ledger.take.remote(key_id, quota, tokens), LEDGER_TIMEOUT_S))
        try:
            taken: Taken = await asyncio.shield(asked)
        except asyncio.CancelledError:  # the request is gone; the ledger may count it still
            self._later(self._refund_if_taken(asked, key_id, quota, tokens))
            raise
        except Exception as exc:  # noqa: BLE001 - a lost ledger must not refuse every request
            logger.warning("quota ledger unavailable (%s): request of %r admitted uncounted",
                           type(exc).__name__, key_id)
            return None
        if taken.wait_s > 0:
            self._refused_until[key_id] = (self.clock() + taken.wait_s, taken.kind)
            raise over_quota(key_id, taken.wait_s, taken.kind)
        return Charge(key_id, quota, tokens, taken.second)

    def refund(self, charge: Charge | None) -> None:
        """Give an admitted request that was not scored back to its key. Sent without waiting
        for the answer: it is called on the request's failure, also when the request's task
        is being cancelled."""
        if charge is not None:
            self._later(self._refund(charge))

    def _later(self, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._sent.add(task)
        task.add_done_callback(self._sent.discard)

    async def _refund_if_taken(self, asked: asyncio.Future, key_id: str, quota: Quota,
                               tokens: int) -> None:
        try:
            taken: Taken = await asked
        except Exception:  # noqa: BLE001 - not counted: nothing to give back
            return
        if taken.wait_s == 0:
            await self._refund(Charge(key_id, quota, tokens, taken.second))

    async def _refund(self, charge: Charge) -> None:
        try:
            await asyncio.wait_for(self.ledger.refund.remote(
                charge.key_id, charge.quota, charge.tokens, charge.second), LEDGER_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the key keeps the charge, nothing else is lost
            logger.warning("quota ledger unavailable (%s): a refund of %r not given",
                           type(exc).__name__, charge.key_id)

    async def usage(self, key_id: str, quota: Quota) -> dict:
        if not quota.limited or self.ledger is None:
            return {"requests_per_minute": None, "tokens_per_minute": None}
        return await self.ledger.usage.remote(key_id, quota)
