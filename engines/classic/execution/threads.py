"""One daemon thread per model instance, running blocking model calls in order for the event loop.

Not a ThreadPoolExecutor: its threads are joined at interpreter exit, so one thread
stuck in a hung `execute()` would keep the server from ever exiting. A daemon
thread is abandoned instead. And nothing a model raises on this thread reaches the
event loop as a BaseException: `SystemExit` or `KeyboardInterrupt` awaited in a
task would stop the loop, so they arrive as `ModelExit`, an ordinary exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class ModelExit(RuntimeError):
    """Model code raised SystemExit, KeyboardInterrupt or another BaseException."""


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Worker:
    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run `fn(*args)` on this worker's thread after the jobs before it; must be called on the loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((loop, future, fn, args))
        return future

    def stop(self) -> None:
        """Let the thread exit after the jobs already submitted (a hung job keeps it, harmlessly)."""
        self._jobs.put(None)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, fn, args = job
            try:
                outcome: tuple[bool, Any] = (True, fn(*args))
            except Exception as exc:
                outcome = (False, exc)
            except BaseException as exc:  # model code: see the module docstring
                outcome = (False, ModelExit(describe(exc)))
            with contextlib.suppress(RuntimeError):  # the loop closed while the job ran
                loop.call_soon_threadsafe(_resolve, future, outcome)


def _resolve(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
