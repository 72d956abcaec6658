"""CPU work a request asks for (chat-template renders), off the event loop, bounded in time and threads.

A template render grows with the conversation, and a template can loop, so it never runs
on the event loop: it runs on one of `threads` worker threads and must finish within
`timeout_s`. A job that overruns answers 400 while its thread finishes in the background;
when every thread is busy a new job answers 503 at once, so runaway renders cannot queue
up without bound.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from engines.errors import ErrorKind, SluiceError

T = TypeVar("T")


class Renderer:
    def __init__(self, timeout_s: float = 5.0, threads: int = 4, allow_client_templates: bool = False) -> None:
        self.timeout_s = timeout_s
        self.allow_client_templates = allow_client_templates  # a template is code the server runs
        # Daemon threads of our own: a render that never ends must not hold up the process's exit,
        # which a ThreadPoolExecutor's threads (joined at exit) would.
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"sluice-render-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()
        self._free = threads

    async def run(self, job: Callable[[], T], what: str = "rendering the chat template") -> T:
        if self._free <= 0:
            raise SluiceError("every renderer is busy; retry later", ErrorKind.OVERLOADED, code="server_busy",
                              retry_after_s=1.0)
        self._free -= 1
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        future.add_done_callback(self._released)
        self._jobs.put((job, future))
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except TimeoutError:
            raise SluiceError(f"{what} took longer than {self.timeout_s:g} s", ErrorKind.INVALID_ARG,
                              param="messages") from None

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)

    def _released(self, _: object) -> None:
        self._free += 1

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, future = item
            loop = future.get_loop()
            result, error = None, None
            try:
                result = job()
            except BaseException as e:  # the waiting request gets it; this thread lives on
                error = e
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:
                pass  # the loop is closed: the server is shutting down


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
