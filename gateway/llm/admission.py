"""Bounded admission: at most `max_running` requests in the engines, `max_queued` waiting.

Both limits follow the model's capacity (gateway.llm.capacity) unless given explicitly:
`set_capacity` changes them live. Raising the running limit admits waiters at once; lowering it
cancels nothing (running requests finish, new ones wait or are refused). Decision logic is
synchronous and pure (`try_admit`); waiting is a thin async layer over it. A request that finds
the queue full is refused at once, so the client gets 503 + Retry-After instead of an unbounded wait.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from engines.errors import ErrorKind, SluiceError
from gateway.llm.capacity import DEFAULT_WORKER_CAPACITY, derived_limits


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Explicit limits per model; None: derived from the model's capacity."""

    max_running: int | None = None
    max_queued: int | None = None

    def __post_init__(self) -> None:
        if self.max_running is not None and self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")
        if self.max_queued is not None and self.max_queued < 0:
            raise ValueError(f"max_queued must be >= 0, got {self.max_queued}")

    def limits(self, capacity: int) -> tuple[int, int]:
        return derived_limits(capacity, self.max_running, self.max_queued)


class QueueFull(SluiceError):
    def __init__(self, running: int, queued: int) -> None:
        super().__init__(f"The server is overloaded ({running} requests running and {queued} queued); retry later.",
                         ErrorKind.OVERLOADED, code="queue_full", retry_after_s=1.0)


class Ticket:
    """One admitted-or-waiting API request holding `cost` engine slots. `release()` is idempotent."""

    def __init__(self, controller: Admission, cost: int, admitted: bool) -> None:
        self._c = controller
        self.cost = cost
        self.admitted = admitted
        # Only a waiting ticket needs an event (860 B): an admitted stream holds none.
        self._event = None if admitted else asyncio.Event()
        self._done = False

    async def wait(self) -> None:
        if self._event is not None:
            await self._event.wait()

    def release(self) -> None:
        if self._done:
            return
        self._done = True
        self._c._release(self)


class Admission:
    """Counts engine requests, not API requests: one request with n=8 takes 8 slots.

    Not thread-safe: use from one event loop. Waiters are woken in arrival order, so a
    large request at the head is not starved by small ones behind it."""

    def __init__(self, config: AdmissionConfig, capacity: int = DEFAULT_WORKER_CAPACITY) -> None:
        self.config = config
        self.capacity = capacity
        self.max_running, self.max_queued = config.limits(capacity)
        self.running = 0  # engine requests admitted
        self.queued = 0  # engine requests waiting
        self._waiting: deque[Ticket] = deque()

    def set_capacity(self, capacity: int) -> bool:
        """Follow the model's capacity (live); True when a limit changed. Waiters that now fit run."""
        self.capacity = capacity
        limits = self.config.limits(capacity)
        if limits == (self.max_running, self.max_queued):
            return False
        self.max_running, self.max_queued = limits
        self._pump()
        return True

    def try_admit(self, cost: int = 1) -> Ticket:
        """Take `cost` slots, or a place in the queue; raise QueueFull if neither is free."""
        # A request wider than the whole model takes all of it when it runs, and never deadlocks.
        cost = max(1, min(cost, self.max_running))
        if self.running + cost <= self.max_running and not self._waiting:
            self.running += cost
            return Ticket(self, cost, True)
        if self.queued + cost > self.max_queued:
            raise QueueFull(self.running, self.queued)
        t = Ticket(self, cost, False)
        self._waiting.append(t)
        self.queued += cost
        return t

    def _release(self, t: Ticket) -> None:
        if t.admitted:
            self.running -= t.cost
        else:
            try:
                self._waiting.remove(t)
                self.queued -= t.cost
            except ValueError:
                pass
        self._pump()

    def _pump(self) -> None:
        # A waiter wider than a lowered limit is admitted once nothing else runs (never deadlocks).
        while self._waiting and (self.running + self._waiting[0].cost <= self.max_running or self.running == 0):
            nxt = self._waiting.popleft()
            self.queued -= nxt.cost
            nxt.admitted = True
            self.running += nxt.cost
            if nxt._event is not None:
                nxt._event.set()
