"""A supervisor for one in-process engine: it notices that the engine's generation loop
died, ends the requests that were in flight, and restarts the engine with backoff.

transformers' continuous batching runs every request on one background thread. When
that thread dies (an exception in the forward pass, an out-of-memory error, anything),
the manager accepts no more requests and, for some failures, never answers the ones it
had. The supervisor polls `loop_alive()`; on a death it calls `fail_in_flight(reason)`
once, so every open stream ends with an error, then `restart()` until it succeeds,
waiting `Backoff.delay_s(n)` before the n-th consecutive attempt. A crash soon after a
restart continues the count, so a crash loop slows down instead of spinning.

The failure count and its backoff are `engines.supervision.Restarts`, the accounting
every background task shares. Everything runs on the engine's event loop. The
supervisor's own loop is itself a `BackgroundTask`, so a bug here is logged and
restarted rather than silently ending supervision.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from engines.supervision import BackgroundTask, Backoff, Restarts, Sleep

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
        self.down = False  # from the death being noticed until a restart succeeded
        self._engine = engine
        # Carried across a crash soon after a restart: a crash loop keeps slowing down.
        self._restarts = Restarts(backoff or Backoff())
        self._poll_s = poll_s
        self._sleep = sleep
        self._watcher = BackgroundTask(f"engine-supervisor-{name}", self._watch, backoff=self._restarts.backoff)

    @property
    def restarts(self) -> int:
        return self._restarts.total

    def start(self) -> None:
        """Begin watching; the engine must be running."""
        self._restarts.started(asyncio.get_running_loop().time())
        self._watcher.start()

    async def stop(self) -> None:
        await self._watcher.stop()

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
        while True:
            delay = self._restarts.failed(loop.time())
            attempt = self._restarts.in_a_row
            log.warning("engine %s: restart attempt %d in %.1f s", self.name, attempt, delay)
            await self._sleep(delay)
            try:
                await self._engine.restart()
            except Exception:
                log.exception("engine %s: restart attempt %d failed", self.name, attempt)
                continue
            break
        self._restarts.restarted(loop.time())
        self.down = False
        log.warning("engine %s: restarted (%d restart(s) since start)", self.name, self.restarts)
