"""Slots kept free for the more urgent classes: trunk reservation, sized by their recent demand.

Strict priority in the queue alone does not keep an interactive request from waiting: when batch
work holds every slot, the interactive request is next in line but still waits for one to free,
about a whole answer's time on a saturated fleet. So a class may take a slot only while enough
stay free for the classes above it to grow to their recent peak: each more urgent class keeps
`MARGIN` times the most it demanded at once lately (running plus waiting, decaying with a
half-life of `HALF_LIFE_S`), less what it runs now, and all of them together at most `MAX_SHARE`
of the slots. Demand, not just what ran, so that a class that had to wait raises its own
reservation at once.

With one class in use (the default: every request `standard`) nothing is reserved, and admission
is what it was. The first interactive requests after a quiet spell find no reservation and may wait
for a slot; from then on the reservation follows their demand.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

HALF_LIFE_S = 60.0
MARGIN = 1.25
MAX_SHARE = 0.5


class Headroom:
    def __init__(self, classes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.running = [0] * classes  # engine slots each class holds now
        self.waiting = [0] * classes  # engine slots each class waits for now
        self.peak = [0.0] * classes  # decaying peak of `running + waiting`
        self._seen = [clock()] * classes
        self._clock = clock

    def add(self, klass: int, cost: int) -> None:
        self.running[klass] += cost
        self._update(klass)

    def remove(self, klass: int, cost: int) -> None:
        self.running[klass] = max(0, self.running[klass] - cost)
        self._update(klass)

    def wait(self, klass: int, cost: int) -> None:
        """`cost` slots of `klass` started (positive) or stopped (negative) waiting."""
        self.waiting[klass] = max(0, self.waiting[klass] + cost)
        self._update(klass)

    def reserved(self, klass: int, max_running: int) -> int:
        """Slots a request of `klass` must leave free for the classes more urgent than it."""
        want = 0
        for j in range(klass):
            self._update(j)
            want += max(0, math.ceil(MARGIN * self.peak[j]) - self.running[j])
        return min(want, int(MAX_SHARE * max_running))

    def _update(self, klass: int) -> None:
        now = self._clock()
        decay = 0.5 ** ((now - self._seen[klass]) / HALF_LIFE_S)
        peak = max(float(self.running[klass] + self.waiting[klass]), self.peak[klass] * decay)
        self.peak[klass] = peak if peak >= 0.5 else 0.0  # under half a request: gone
        self._seen[klass] = now
