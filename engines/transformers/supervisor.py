"""A supervisor for one in-process engine: it notices that the engine's generation loop
died, ends the requests that were in flight, and restarts the engine with backoff.

transformers' continuous batching runs every request on one background thread. When
that thread dies (an exception in the forward pass, an out-of-memory error, anything),
the manager accepts no more requests and, for some failures, never answers the ones it
had. The supervisor polls `loop_alive()`; on a death it calls `fail_in_flight(reason)`
once, so every open stream ends with an error, then `restart()` until it succeeds,
waiting `Backoff.delay_s(n)` before the n-th consecutive attempt. A crash soon after a
restart continues the count, so a crash loop slows down instead of spinning.

Everything runs on the engine's event loop. The supervisor's own loop is itself run
under `supervise`, so a bug here is logged and restarted rather than silently ending
supervision.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from engines.supervision import Backoff, Sleep, supervise

log = logging.getLogger(__name__)


class SupervisedEngine(Protocol):
    """What the supervisor needs from an engine; all called on the engine's event loop."""

    def loop_alive(self) -> bool:
        """False once the engine's generation loop is gone for good (not merely idle)."""

    def fail_in_flight(self, reason: str) -> int:
        """End every open request with an error and refuse new ones until `restart` succeeds;
        returns how many were ended. Must not raise."""

    async def restart(self) -> None:
        """Replace the dead generation loop with a fresh, warmed-up one and accept requests
        again; raises if that failed (the supervisor tries again after a delay)."""


class EngineSupervisor:
    """Watches one engine. `restarts` counts successful restarts (exported as a metric)."""

    def __init__(self, name: str, engine: SupervisedEngine, *, backoff: Backoff | None = None,
                 poll_s: float = 0.25, sleep: Sleep = asyncio.sleep) -> None:
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s}")
        self.name = name
        self.restarts = 0
        self.down = False  # from the death being noticed until a restart succeeded
        self._engine = engine
        self._backoff = backoff or Backoff()
        self._poll_s = poll_s
        self._sleep = sleep
        self._failures = 0  # consecutive failures, carried across a crash soon after a restart
        self._up_since = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin watching; the engine must be running."""
        if self._task is None:
            self._up_since = asyncio.get_running_loop().time()
            self._task = asyncio.create_task(
                supervise(f"engine-supervisor-{self.name}", self._watch, backoff=self._backoff),
                name=f"engine-supervisor-{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            while self._engine.loop_alive():
                await self._sleep(self._poll_s)
            await self._recover()

    async def _recover(self) -> None:
        loop = asyncio.get_running_loop()
        self.down = True
        ended = self._engine.fail_in_flight(f"the engine {self.name} failed and is restarting")
        log.error("engine %s: the generation loop died; ended %d request(s) in flight; restarting",
                  self.name, ended)
        if loop.time() - self._up_since >= self._backoff.reset_after_s:
            self._failures = 0
        while True:
            self._failures += 1
            delay = self._backoff.delay_s(self._failures)
            log.warning("engine %s: restart attempt %d in %.1f s", self.name, self._failures, delay)
            await self._sleep(delay)
            try:
                await self._engine.restart()
            except Exception:
                log.exception("engine %s: restart attempt %d failed", self.name, self._failures)
                continue
            break
        self.restarts += 1
        self.down = False
        self._up_since = loop.time()
        log.warning("engine %s: restarted (%d restart(s) since start)", self.name, self.restarts)
