"""Keeping background work alive: a bounded backoff and a supervised asyncio loop.

Every long-lived task in Sluice (an engine's watchdog, the router's health checks,
scrapes and KV-event subscribers) is meant to run until it is cancelled. If one
raises, nothing would notice: an asyncio task that dies keeps its exception until
it is garbage collected. `supervise` runs such a loop, logs each failure with its
traceback, waits a bounded, growing delay and starts it again, and tells the
caller (a metric) every time it does.

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
    """Delays between restarts: `initial_s`, doubling per consecutive failure, at most `max_s`.

    A run that lasted `reset_after_s` counts as healthy: the failure after it starts
    again from `initial_s`, so a rare crash is restarted fast and a crash loop slowly."""

    initial_s: float = 0.5
    max_s: float = 30.0
    reset_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.max_s < self.initial_s:
            raise ValueError(f"backoff needs 0 < initial_s <= max_s, got {self.initial_s} and {self.max_s}")
        if self.reset_after_s <= 0:
            raise ValueError(f"reset_after_s must be > 0, got {self.reset_after_s}")

    def delay_s(self, failures: int) -> float:
        """The wait before the restart that follows `failures` consecutive failures (>= 1)."""
        return min(self.max_s, self.initial_s * 2.0 ** min(max(failures - 1, 0), 32))


Sleep = Callable[[float], Awaitable[None]]


async def supervise(name: str, run: Callable[[], Awaitable[None]], *, backoff: Backoff | None = None,
                    on_restart: Callable[[str], None] | None = None, sleep: Sleep = asyncio.sleep) -> None:
    """Run `run()` until cancelled, restarting it whenever it raises or returns.

    `run` is a loop meant never to end; returning counts as a failure too (it is logged,
    not silent). `on_restart(name)` is called right before each restart and must not
    raise. Cancellation, and BaseExceptions other than Exception, pass through."""
    policy = backoff or Backoff()
    loop = asyncio.get_running_loop()
    failures = 0
    while True:
        started = loop.time()
        try:
            await run()
            log.error("background task %s returned; it should run until stopped", name)
        except Exception:
            log.exception("background task %s failed", name)
        failures = 1 if loop.time() - started >= policy.reset_after_s else failures + 1
        delay = policy.delay_s(failures)
        log.warning("restarting background task %s in %.1f s (failure %d in a row)", name, delay, failures)
        await sleep(delay)
        if on_restart is not None:
            on_restart(name)


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Have the kernel send `signum` to this process when its parent dies (Linux; elsewhere nothing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signum)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
