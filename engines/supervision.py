"""Keeping background work alive: the one place that restarts a failed background task,
counts the restart and says so.

Every long-lived task in Sluice (a model's scheduler, the repository poller, an engine's
watchdog, the router's health checks, scrapes and KV-event subscribers, Kubernetes
discovery) is meant to run until it is cancelled. If one raises, nothing would notice:
an asyncio task that dies keeps its exception until it is garbage collected. A
`BackgroundTask` runs such a loop, logs each failure with its traceback, waits a
bounded, growing delay (`Backoff`), starts it again, counts the restart (`Restarts`)
and tells the caller (a metric) every time it does.

This module sits in `engines/`, the bottom layer, so the router and the gateway
use the same policy. It imports nothing but the standard library.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays between restarts: `initial_s`, times `factor` per consecutive failure, at most `max_s`.

    A run that lasted `reset_after_s` counts as healthy: the failure after it starts
    again from `initial_s`, so a rare crash is restarted fast and a crash loop slowly."""

    initial_s: float = 0.5
    max_s: float = 30.0
    reset_after_s: float = 60.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.max_s < self.initial_s:
            raise ValueError(f"backoff needs 0 < initial_s <= max_s, got {self.initial_s} and {self.max_s}")
        if self.reset_after_s <= 0:
            raise ValueError(f"reset_after_s must be > 0, got {self.reset_after_s}")
        if self.factor < 1:
            raise ValueError(f"factor must be >= 1, got {self.factor}")

    def delay_s(self, failures: int) -> float:
        """The wait before the restart that follows `failures` consecutive failures (>= 1)."""
        return min(self.max_s, self.initial_s * self.factor ** min(max(failures - 1, 0), 32))


# A model's scheduler holds the requests of its queue: a one-off crash is restarted after 10 ms,
# a crash loop at most once a second; ten quiet seconds count as healthy.
QUICK_BACKOFF = Backoff(initial_s=0.01, max_s=1.0, reset_after_s=10.0, factor=10.0)

Sleep = Callable[[float], Awaitable[None]]


class Restarts:
    """The restart accounting of one supervised thing, in seconds of its event loop's clock.

    `in_a_row` counts failures since the last run that lasted `backoff.reset_after_s` and
    picks the next delay; a failed restart attempt counts too, so a crash loop slows down.
    `total` counts restarts since start (exported as a metric by the callers)."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff
        self.total = 0
        self.in_a_row = 0
        self._up_since: float | None = None  # None while down: a failed attempt was no run

    def started(self, now_s: float) -> None:
        self._up_since = now_s

    def failed(self, now_s: float) -> float:
        """Count a failure at `now_s`; returns the delay before the next attempt, seconds."""
        if self._up_since is not None and now_s - self._up_since >= self.backoff.reset_after_s:
            self.in_a_row = 0
        self._up_since = None
        self.in_a_row += 1
        return self.backoff.delay_s(self.in_a_row)

    def restarted(self, now_s: float) -> None:
        self.total += 1
        self.started(now_s)


class BackgroundTask:
    """Runs `run()` as an asyncio task until `stop()`, restarting it whenever it raises or returns.

    `run` is a loop meant never to end; returning counts as a failure too (it is logged,
    not silent). After a failure `on_crash(exc)` is called at once (to fail what the dead
    loop held; it may raise, which is logged), and `on_restart()` right before each restart
    (a metric; must not raise). `restarts.total` counts the restarts. Cancellation, and
    BaseExceptions other than Exception, end the task."""

    def __init__(self, name: str, run: Callable[[], Awaitable[None]], *, backoff: Backoff | None = None,
                 on_crash: Callable[[Exception], None] | None = None, on_restart: Callable[[], None] | None = None,
                 sleep: Sleep = asyncio.sleep) -> None:
        self.name = name
        self.restarts = Restarts(backoff or Backoff())
        self._run = run
        self._on_crash = on_crash
        self._on_restart = on_restart
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start it on the running loop (once; a second call does nothing)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._supervise(), name=self.name)

    def cancel(self) -> None:
        """Cancel it without waiting, from code that cannot await (the task object is then spent)."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        """Cancel it and wait until it has ended."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        self.restarts.started(loop.time())
        while True:
            try:
                await self._run()
                log.error("background task %s returned; it should run until stopped", self.name)
            except Exception as exc:
                log.exception("background task %s failed", self.name)
                self._crashed(exc)
            delay = self.restarts.failed(loop.time())
            log.warning("restarting background task %s in %.1f s (failure %d in a row, %d restart(s) before)",
                        self.name, delay, self.restarts.in_a_row, self.restarts.total)
            await self._sleep(delay)
            self.restarts.restarted(loop.time())
            if self._on_restart is not None:
                self._on_restart()

    def _crashed(self, exc: Exception) -> None:
        if self._on_crash is None:
            return
        try:
            self._on_crash(exc)
        except Exception:
            log.exception("cleaning up after background task %s failed", self.name)


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Have the kernel send `signum` to this process when its parent dies (Linux; elsewhere nothing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signum)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
