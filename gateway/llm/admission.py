"""Bounded admission: at most `max_running` requests in the engine, `max_queued` waiting.

Decision logic is synchronous and pure (`try_admit`); waiting is a thin async
layer over it. A request that finds the queue full is refused at once, so the
client gets 503 + Retry-After instead of an unbounded wait.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from engines.errors import ErrorKind, SluiceError


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    max_running: int = 64
    max_queued: int = 256

    def __post_init__(self) -> None:
        if self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")
        if self.max_queued < 0:
            raise ValueError(f"max_queued must be >= 0, got {self.max_queued}")


class QueueFull(SluiceError):
    def __init__(self, running: int, queued: int) -> None:
        super().__init__(f"The server is overloaded ({running} requests running and {queued} queued); retry later.",
                         ErrorKind.OVERLOADED, code="queue_full", retry_after_s=1.0)


class Ticket:
    """One admitted-or-waiting request. `release()` is idempotent."""

    def __init__(self, controller: Admission, admitted: bool) -> None:
        self._c = controller
        self.admitted = admitted
        self._event = asyncio.Event()
        if admitted:
            self._event.set()
        self._done = False

    async def wait(self) -> None:
        await self._event.wait()

    def release(self) -> None:
        if self._done:
            return
        self._done = True
        self._c._release(self)


class Admission:
    """Not thread-safe: use from one event loop."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.running = 0
        self._waiting: deque[Ticket] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def try_admit(self) -> Ticket:
        """Take a slot, or a place in the queue; raise QueueFull if neither is free."""
        if self.running < self.config.max_running and not self._waiting:
            self.running += 1
            return Ticket(self, True)
        if len(self._waiting) >= self.config.max_queued:
            raise QueueFull(self.running, len(self._waiting))
        t = Ticket(self, False)
        self._waiting.append(t)
        return t

    def _release(self, t: Ticket) -> None:
        if t.admitted:
            self.running -= 1
        else:
            try:
                self._waiting.remove(t)
            except ValueError:
                pass
        while self._waiting and self.running < self.config.max_running:
            nxt = self._waiting.popleft()
            nxt.admitted = True
            self.running += 1
            nxt._event.set()
