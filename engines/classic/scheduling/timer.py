"""Wake-ups at a monotonic time, precise below a millisecond, for the dynamic batcher's delay.

uvloop keeps time in whole milliseconds: `call_later(0.0005)` fires on the next loop
iteration, so a driver that re-arms until a 500 µs delay is over spins the loop for those
500 µs (it cost 0.5 ms of CPU per request at concurrency 1). `wake_at` uses the loop's own
timer for what is a millisecond or more away, and one shared daemon thread, which sleeps
in the kernel to the microsecond, for the last part; either way the callback runs on the loop.

Contract: `wake_at(loop, deadline_ns, callback)` calls `callback()` on `loop`, once, no earlier
than `deadline_ns` (time.monotonic_ns) unless cancelled through the returned handle first.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable

_LOOP_RESOLUTION_NS = 1_000_000  # what uvloop's timers can tell apart


class WakeHandle:
    __slots__ = ("_callback", "_cancelled", "_timer")

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._cancelled = False
        self._timer: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        self._cancelled = True
        if self._timer is not None:
            self._timer.cancel()

    def _fire(self) -> None:  # on the loop
        if not self._cancelled:
            self._cancelled = True
            self._callback()


class _SleeperThread:
    """One daemon thread holding a heap of (deadline, handle, loop); it posts each due handle to its loop."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, WakeHandle, asyncio.AbstractEventLoop]] = []
        self._ids = itertools.count()
        self._cv = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None

    def add(self, deadline_ns: int, handle: WakeHandle, loop: asyncio.AbstractEventLoop) -> None:
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sluice-batch-timer", daemon=True)
                self._thread.start()
            earliest = not self._heap or deadline_ns < self._heap[0][0]
            heapq.heappush(self._heap, (deadline_ns, next(self._ids), handle, loop))
            if earliest:
                self._cv.notify()

    def _run(self) -> None:
        with self._cv:
            while True:
                while self._heap and self._heap[0][2]._cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cv.wait()
                    continue
                wait_ns = self._heap[0][0] - time.monotonic_ns()
                if wait_ns > 0:
                    self._cv.wait(wait_ns / 1e9)
                    continue
                _, _, handle, loop = heapq.heappop(self._heap)
                with contextlib.suppress(RuntimeError):  # that loop has closed
                    loop.call_soon_threadsafe(handle._fire)


_SLEEPER = _SleeperThread()


def wake_at(loop: asyncio.AbstractEventLoop, deadline_ns: int, callback: Callable[[], None]) -> WakeHandle:
    handle = WakeHandle(callback)
    wait_ns = deadline_ns - time.monotonic_ns()
    if wait_ns <= 0:
        loop.call_soon(handle._fire)
    elif wait_ns >= 2 * _LOOP_RESOLUTION_NS:
        # The loop's timer for all but the last millisecond or so, then the precise path from there.
        def near() -> None:
            if not handle._cancelled:
                handle._timer = None
                _SLEEPER.add(deadline_ns, handle, loop)
        handle._timer = loop.call_later((wait_ns - _LOOP_RESOLUTION_NS) / 1e9, near)
    else:
        _SLEEPER.add(deadline_ns, handle, loop)
    return handle
