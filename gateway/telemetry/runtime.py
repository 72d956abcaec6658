"""The gateway process's own health on `/metrics`: prometheus_client's process collector (CPU,
memory, fds, start time) and GC collector (collections and collected objects per generation), and
how late the event loop runs what is ready (`LoopLag`).

Every request, stream relay and health check of a gateway shares one event loop: a blocking call
or a long synchronous stretch on it delays all of them at once. `LoopLag` sleeps `interval_s` and
records by how much its wake-up came late; the lag of every other ready callback is of the same
order. It runs as a `BackgroundTask`: if it fails it is logged, restarted and counted in
`sluice_background_task_restarts_total{task="event_loop_lag"}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.gc_collector import GCCollector
from prometheus_client.process_collector import ProcessCollector

from engines.supervision import BackgroundTask

TASK = "event_loop_lag"
_LAG_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def register_runtime_collectors(registry: CollectorRegistry) -> None:
    """The process and GC collectors, on `registry`: each app has a registry of its own, which the
    global registry's copies do not reach."""
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)


class LoopLag:
    """Measures the event loop's lag every `interval_s` while started (see the module doc)."""

    def __init__(self, registry: CollectorRegistry, interval_s: float = 0.25,
                 on_restart: Callable[[], None] | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"the event-loop lag interval must be > 0 s, got {interval_s}")
        self.interval_s = interval_s
        self.lag = Histogram("sluice_event_loop_lag_seconds",
                             "How late the event loop woke a timer it had due, seconds (sampled every "
                             f"{interval_s:g} s).", buckets=_LAG_BUCKETS_S, registry=registry)
        self.last = Gauge("sluice_event_loop_lag_last_seconds",
                          "The event loop's lag at its last sample, seconds.", registry=registry)
        self._task = BackgroundTask(TASK, self._run, on_restart=on_restart)

    def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.record(max(0.0, loop.time() - due))

    def record(self, lag_s: float) -> None:
        self.lag.observe(lag_s)
        self.last.set(lag_s)
