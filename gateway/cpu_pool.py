"""CPU work a request asks for, off the event loop, bounded in size, time and threads.

Work that grows with what a client sends never runs on the event loop, where it would stop
every other request (a 7 MB prompt took the loop 4.7 s to tokenize): chat-template renders,
tokenization and detokenization of client text and ids (`tokenize`, refused past
`max_prompt_chars` characters), and the decoding of large JSON bodies (`gateway.json_body`).
It runs on one of `threads` worker threads. Jobs wait for a thread in a bounded queue
(`max_waiting`); a job that did not start within `timeout_s` (every thread busy) answers 503
with Retry-After, and a full queue refuses at once. A template render must also finish within
`timeout_s` of starting (a template can loop): one that overran answers 400 while its thread
finishes in the background. Tokenization and decoding have no such deadline: their size bound
bounds them. Work below `INLINE_CHARS` runs inline, where a thread hop would cost more than it saves.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from engines.errors import ErrorKind, SluiceError

T = TypeVar("T")

INLINE_CHARS = 4096  # characters (or token ids) tokenized inline: about 3 ms of the loop at most
INLINE_JSON_BYTES = 256 * 1024  # JSON bodies checked and decoded inline: about 1 ms of json.loads


@dataclass(slots=True)
class _Job(Generic[T]):
    fn: Callable[[], T]
    loop: asyncio.AbstractEventLoop
    started: asyncio.Future[None] = field(init=False)
    done: asyncio.Future[T] = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.loop.create_future()
        self.done = self.loop.create_future()


class Renderer:
    def __init__(self, timeout_s: float = 5.0, threads: int = 4, allow_client_templates: bool = False,
                 max_waiting: int = 256, max_prompt_chars: int = 8 * 1024 * 1024) -> None:
        self.timeout_s = timeout_s
        self.max_prompt_chars = max_prompt_chars  # client text per request, before it is tokenized
        self.allow_client_templates = allow_client_templates  # a template is code the server runs
        self.max_waiting = max_waiting
        self._waiting = 0
        # Daemon threads of our own: a render that never ends must not hold up the process's exit,
        # which a ThreadPoolExecutor's threads (joined at exit) would.
        self._jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"sluice-render-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    async def tokenize(self, fn: Callable[[], T], chars: int, param: str, work: int | None = None) -> T:
        """`fn` (tokenization of client text of `chars` characters, or other work of `work` items):
        refused past `max_prompt_chars`, inline when small, else on a worker thread."""
        if chars > self.max_prompt_chars:
            raise SluiceError(f"the prompt has {chars} characters; this server accepts at most "
                              f"{self.max_prompt_chars}", ErrorKind.INVALID_ARG, param=param)
        if (chars if work is None else work) <= INLINE_CHARS:
            return fn()
        return await self.run(fn, deadline=False)

    async def run(self, fn: Callable[[], T], what: str = "rendering the chat template", deadline: bool = True) -> T:
        """`fn` on a worker thread; with `deadline`, it must finish within `timeout_s` of starting."""
        if self._waiting >= self.max_waiting:
            raise SluiceError("too much CPU work is waiting; retry later", ErrorKind.OVERLOADED,
                              code="server_busy", retry_after_s=1.0)
        job: _Job[T] = _Job(fn, asyncio.get_running_loop())
        self._waiting += 1
        job.started.add_done_callback(self._left_queue)
        self._jobs.put(job)
        try:
            await asyncio.wait_for(asyncio.shield(job.started), self.timeout_s)
        except TimeoutError:
            job.started.cancel()  # a worker that picks it up later skips it
            raise SluiceError("every CPU worker thread is busy; retry later", ErrorKind.OVERLOADED,
                              code="server_busy", retry_after_s=1.0) from None
        if not deadline:
            return await asyncio.shield(job.done)  # bounded by its size; a cancelled request leaves it to finish
        try:
            return await asyncio.wait_for(asyncio.shield(job.done), self.timeout_s)
        except TimeoutError:
            raise SluiceError(f"{what} took longer than {self.timeout_s:g} s", ErrorKind.INVALID_ARG,
                              param="messages") from None

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)

    def _left_queue(self, _: object) -> None:
        self._waiting -= 1

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            if not self._settle(job, job.started, None, None, start=True):
                continue  # its request gave up waiting
            result, error = None, None
            try:
                result = job.fn()
            except BaseException as e:  # the waiting request gets it; this thread lives on
                error = e
            self._settle(job, job.done, result, error)

    @staticmethod
    def _settle(job: _Job[Any], future: asyncio.Future[Any], result: Any, error: BaseException | None,
                start: bool = False) -> bool:
        """Complete `future` on its loop; for `start`, wait to learn whether the job still wants to run."""
        outcome = threading.Event()
        wanted = [True]

        def settle() -> None:
            if future.done():
                wanted[0] = False
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
            outcome.set()

        try:
            job.loop.call_soon_threadsafe(settle)
        except RuntimeError:
            return False  # the loop is closed: the server is shutting down
        if start:
            outcome.wait(timeout=1.0)
        return wanted[0]
