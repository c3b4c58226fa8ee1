"""Shedding before a request is read, while the scorers refuse (docs/ARCHITECTURE.md, "Load
control").

The scorers decide what is too much: a job that could not start within
`scheduler.max_queue_wait_s` at their measured throughput is refused
(gpu_worker/serving/scheduler.py). Far past capacity an ingress replica would still read, validate
and tokenize every request only to hand back the scorers' 503, spending the CPU that the requests
that do get in need. So each ingress replica keeps the share of its jobs the scorers refused over
the last WINDOW_S and adjusts the share of new requests it answers 503 before reading them: up
while the scorers refuse more than TARGET_REFUSED_SHARE of what reaches them (so they stay full:
goodput), down by DECAY on each update where they refuse nothing (gently: a sharp drop overshoots,
floods the scorers and makes the share swing). It follows the scorers actually running (more of them
refuse less) with no count of replicas and no call to Serve's controller; with no refusal it is
0, and a request costs one comparison.
"""

from __future__ import annotations

import collections
import random
import time
from collections.abc import Callable

WINDOW_S = 0.5  # the scorers' answers the refused share is taken over
UPDATE_S = 0.1  # the shed share changes at most this often
TARGET_REFUSED_SHARE = 0.1  # of the jobs reaching the scorers past capacity: they stay full
GAIN = 0.2  # shed share added per update, per unit of refused share above the target
MAX_SHARE = 0.9  # some requests always reach the scorers: their answers end the shedding
DECAY = 0.8  # the share kept per update without a refusal: from MAX_SHARE to 0 in about 2 s


class Shedding:
    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 draw: Callable[[], float] = random.random) -> None:
        self.share = 0.0  # of new requests answered 503 before they are read
        self._clock, self._draw = clock, draw
        self._answers: collections.deque[tuple[float, bool]] = collections.deque()
        self._refused = 0  # refusals among _answers
        self._updated = float("-inf")

    def shed(self) -> bool:
        """True: answer this request 503 before reading it."""
        if not self.share:
            return False
        if self._clock() - self._updated > WINDOW_S:  # no answer lately: the overload is over
            self.share = 0.0
            return False
        return self._draw() < self.share

    def answered(self, refused: bool) -> None:
        """A scorer answered one of this replica's jobs: refused it (overloaded), or not."""
        now = self._clock()
        self._answers.append((now, refused))
        self._refused += refused
        while self._answers[0][0] < now - WINDOW_S:
            self._refused -= self._answers.popleft()[1]
        if now - self._updated < UPDATE_S:
            return
        self._updated = now
        refused_share = self._refused / len(self._answers)
        if refused_share == 0:
            self.share *= DECAY
        else:
            self.share += GAIN * (refused_share - TARGET_REFUSED_SHARE)
        self.share = min(MAX_SHARE, self.share) if self.share >= 0.01 else 0.0
