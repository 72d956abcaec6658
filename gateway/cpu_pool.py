"""CPU work a request asks for, off the event loop, bounded in size, time and threads.

Work that grows with what a client sends never runs on the event loop, where it would stop
every other request (a 7 MB prompt took the loop 4.7 s to tokenize): chat-template renders,
tokenization and detokenization of client text and ids (`tokenize`, refused past
`max_prompt_chars` characters), and the decoding of large JSON bodies (`gateway.json_body`).

It runs on worker threads of two pools, so that bulk work cannot starve chat:
- **renders** (`run`): chat-template renders, on `threads` threads of their own. A render must
  also finish within `timeout_s` of starting (a template can loop): one that overran answers 400
  while its thread finishes in the background.
- **bulk** (`bulk`, `tokenize`): tokenization and JSON decoding, on `bulk_threads` threads. They
  have no deadline (their size bound bounds them), so each key (`current_key_id`) may hold at most
  `per_key` of them, waiting or running: one key cannot take every bulk thread. Requests without a
  key (a gateway without keys, where there is no other key to share with) are not capped per key.

In each pool, jobs wait for a thread in a bounded queue (`max_waiting`); a job that did not start
within `timeout_s` (every thread, or its key's share, busy) answers 503 with Retry-After, and a
full queue refuses at once. Work below `INLINE_CHARS` runs inline, where a thread hop would cost
more than it saves.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

from engines.errors import ErrorKind, SluiceError
from gateway.security.access import current_key_id

T = TypeVar("T")

INLINE_CHARS = 4096  # characters (or token ids) tokenized inline: about 3 ms of the loop at most
INLINE_JSON_BYTES = 256 * 1024  # JSON bodies checked and decoded inline: about 1 ms of json.loads
_WAITING, _STARTED, _DROPPED = 0, 1, 2


def _busy(message: str) -> SluiceError:
    return SluiceError(message, ErrorKind.OVERLOADED, code="server_busy", retry_after_s=1.0)


@dataclass(slots=True)
class _Job(Generic[T]):
    fn: Callable[[], T]
    loop: asyncio.AbstractEventLoop
    state: int = _WAITING  # moved on only under `_Threads.lock`: by the worker that starts it, or its request
    started: asyncio.Future[None] = field(init=False)
    done: asyncio.Future[T] = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.loop.create_future()
        self.done = self.loop.create_future()


class _Threads:
    """One pool: daemon threads of our own (a render that never ends must not hold up the process's
    exit, which a ThreadPoolExecutor's threads, joined at exit, would) and a bounded queue."""

    def __init__(self, name: str, threads: int, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self.waiting = 0
        self.lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"sluice-{name}-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    async def run(self, fn: Callable[[], T], start_s: float, deadline_s: float | None, what: str,
                  release: Callable[[], None] | None = None) -> T:
        """`fn` once a thread takes it within `start_s` (else 503); within `deadline_s` of its start.
        `release` is called once the job is over: run, or dropped before it ran."""
        if self.waiting >= self.max_waiting:
            if release is not None:
                release()
            raise _busy("too much CPU work is waiting; retry later")
        job: _Job[T] = _Job(fn, asyncio.get_running_loop())
        if release is not None:
            job.done.add_done_callback(lambda _: release())
        self.waiting += 1
        self._jobs.put(job)
        try:
            await asyncio.wait_for(asyncio.shield(job.started), max(start_s, 0.0))
        except (TimeoutError, asyncio.CancelledError) as e:
            if self._drop(job):
                if isinstance(e, TimeoutError):
                    raise _busy("every CPU worker thread is busy; retry later") from None
                raise
            if not isinstance(e, TimeoutError):
                raise  # its request went away after the job started: the job runs on, then releases
        finally:
            self.waiting -= 1
        if deadline_s is None:
            return await asyncio.shield(job.done)  # bounded by its size; a cancelled request leaves it to finish
        try:
            return await asyncio.wait_for(asyncio.shield(job.done), deadline_s)
        except TimeoutError:
            raise SluiceError(f"{what} took longer than {deadline_s:g} s", ErrorKind.INVALID_ARG,
                              param="messages") from None

    def _drop(self, job: _Job[Any]) -> bool:
        """Take back a job no thread has started (a thread that picks it up later skips it)."""
        with self.lock:
            if job.state != _WAITING:
                return False
            job.state = _DROPPED
        job.done.cancel()
        return True

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self.lock:
                if job.state != _WAITING:
                    continue  # its request gave up waiting
                job.state = _STARTED
            _settle(job.loop, job.started, None, None)
            result, error = None, None
            try:
                result = job.fn()
            except BaseException as e:  # the waiting request gets it; this thread lives on
                error = e
            _settle(job.loop, job.done, result, error)


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any,
            error: BaseException | None) -> None:
    """Complete `future` on its loop (unless its request stopped waiting for it)."""
    def settle() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:
        pass  # the loop is closed: the server is shutting down


@dataclass(slots=True)
class _Share:
    slots: asyncio.Semaphore
    users: int = 0  # requests waiting for a slot or holding one


class Renderer:
    def __init__(self, timeout_s: float = 5.0, threads: int = 4, allow_client_templates: bool = False,
                 max_waiting: int = 256, max_prompt_chars: int = 8 * 1024 * 1024, bulk_threads: int = 4,
                 per_key: int | None = None) -> None:
        self.timeout_s = timeout_s
        self.max_prompt_chars = max_prompt_chars  # client text per request, before it is tokenized
        self.allow_client_templates = allow_client_templates  # a template is code the server runs
        self.per_key = per_key if per_key is not None else max(1, bulk_threads // 2)
        self._renders = _Threads("render", threads, max_waiting)
        self._bulk = _Threads("bulk", bulk_threads, max_waiting)
        self._keys: dict[str, _Share] = {}  # key id: its share of the bulk threads, while it uses them

    async def tokenize(self, fn: Callable[[], T], chars: int, param: str, work: int | None = None) -> T:
        """`fn` (tokenization of client text of `chars` characters, or other work of `work` items):
        refused past `max_prompt_chars`, inline when small, else on a bulk thread."""
        if chars > self.max_prompt_chars:
            raise SluiceError(f"the prompt has {chars} characters; this server accepts at most "
                              f"{self.max_prompt_chars}", ErrorKind.INVALID_ARG, param=param)
        if (chars if work is None else work) <= INLINE_CHARS:
            return fn()
        return await self.bulk(fn)

    async def run(self, fn: Callable[[], T], what: str = "rendering the chat template") -> T:
        """`fn` (a chat-template render) on a render thread; it must finish within `timeout_s` of starting."""
        return await self._renders.run(fn, self.timeout_s, self.timeout_s, what)

    async def bulk(self, fn: Callable[[], T]) -> T:
        """`fn` (tokenization, JSON decoding) on a bulk thread, within the current key's share of them."""
        key = current_key_id.get()
        if key is None:
            return await self._bulk.run(fn, self.timeout_s, None, "")
        share = self._keys.setdefault(key, _Share(asyncio.Semaphore(self.per_key)))
        share.users += 1
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(share.slots.acquire(), self.timeout_s)
        except (TimeoutError, asyncio.CancelledError) as e:
            self._leave(key, share, acquired=False)
            if isinstance(e, TimeoutError):
                raise _busy("this key's share of the CPU worker threads is busy; retry later") from None
            raise
        # The share is held until the job is over, even when its request went away before.
        return await self._bulk.run(fn, self.timeout_s - (time.monotonic() - t0), None, "",
                                    release=partial(self._leave, key, share, True))

    def _leave(self, key: str, share: _Share, acquired: bool) -> None:
        if acquired:
            share.slots.release()
        share.users -= 1
        if share.users == 0 and self._keys.get(key) is share:
            del self._keys[key]

    def close(self) -> None:
        self._renders.close()
        self._bulk.close()
