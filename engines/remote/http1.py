"""A small HTTP/1.1 client for streaming from workers: keep-alive pool, chunked bodies, back-pressure.

Why not httpx here: relaying a token stream through httpx/httpcore/h11/anyio cost the gateway
more CPU per token than everything else together (docs/routing.md, "Gateway overhead").
This client does only what a worker stream needs, on an `asyncio.Protocol`:

- `Pool.exchange(head, body)` writes one request on an idle keep-alive connection (a new one
  if none is idle, at most `max_connections`) and returns an `Exchange` once the response
  head has arrived. A reused connection that fails before any response byte is retried once
  on a fresh connection (the server closed it while it was idle).
- `Exchange.read()` returns *all* body bytes that have arrived since the last call (so chunks
  that arrive together are handled together), ``b""`` at the end of the body. Reading pauses
  while more than a MiB wait unread, so a slow consumer holds bounded memory.
- A body silent for `Exchange.idle_timeout_s` raises TimeoutError; one watchdog timer per
  exchange is re-armed lazily, not one timer per read.
- `Exchange.close()` returns a fully read connection to the pool and closes any other, which is
  how a worker learns that the client left (vLLM then aborts the request).

Errors: `ConnectionError` (refused, reset, closed early), `TimeoutError`, `ProtocolError` (a
malformed response). Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from collections import deque

from engines.remote.wire import DONE, ProtocolError, ResponseProtocol

__all__ = ["Exchange", "Pool", "ProtocolError", "header_lines"]


def header_lines(headers: dict[str, str]) -> bytes:
    """``Name: value\r\n`` lines; ValueError for a name or value that could split the head (CR, LF, NUL)
    or is not latin-1, so no header can smuggle a second request onto a pooled connection."""
    out = []
    for name, value in headers.items():
        line = f"{name}: {value}"
        if "\r" in line or "\n" in line or "\0" in line or ":" in name or not name:
            raise ValueError(f"header {name!r} cannot be sent")
        out.append(line)
    return ("\r\n".join(out) + "\r\n").encode("latin-1") if out else b""


class Exchange:
    """One request's response: status, headers, and its body read in arrival-sized pieces."""

    def __init__(self, pool: Pool, conn: ResponseProtocol, read_timeout_s: float) -> None:
        self._pool = pool
        self._conn = conn
        self.status = conn.status
        self.headers = conn.headers
        self._idle_timeout_s = read_timeout_s
        self._timer: asyncio.TimerHandle | None = None
        self._released = False

    @property
    def idle_timeout_s(self) -> float:
        """How long `read()` may wait for the next bytes before TimeoutError."""
        return self._idle_timeout_s

    @idle_timeout_s.setter
    def idle_timeout_s(self, value: float) -> None:
        self._idle_timeout_s = value
        self._disarm()  # the next wait arms the watchdog with the new bound

    async def read(self) -> bytes:
        """The body bytes that arrived since the last call; b"" once the body is complete."""
        c = self._conn
        while True:
            data = c.take()
            if data:
                return data
            if c.state == DONE:
                return b""
            if c.error is not None:
                raise c.error
            waiter = c.loop.create_future()
            c.waiter = waiter
            if self._timer is None:
                self._timer = c.loop.call_at(c.last_data_s + self._idle_timeout_s, self._watch)
            try:
                await waiter
            finally:
                c.waiter = None

    async def rest(self, delay_s: float) -> None:
        """Leave the socket unread for `delay_s`: what the worker sends meanwhile waits in the kernel,
        and the next `read()` takes all of it at once."""
        c = self._conn
        c.hold(True)
        try:
            await asyncio.sleep(delay_s)
        finally:
            c.hold(False)

    def _watch(self) -> None:
        """The watchdog: fails a waiting read once no byte came for the bound; else re-arms."""
        self._timer = None
        c = self._conn
        waiter = c.waiter
        if waiter is None or waiter.done():
            return  # nobody waits: the next wait arms it again
        due = c.last_data_s + self._idle_timeout_s
        if c.loop.time() >= due:
            waiter.set_exception(TimeoutError(f"no data for {self._idle_timeout_s:g} s"))
        else:
            self._timer = c.loop.call_at(due, self._watch)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def drain(self, timeout_s: float) -> None:
        """Read (and drop) what is left of the body, for at most `timeout_s`: a connection
        read to its end goes back to the pool. Errors end it quietly (it is then closed)."""
        try:
            async with asyncio.timeout(timeout_s):
                while await self.read():
                    pass
        except (OSError, TimeoutError, ValueError):
            pass

    def abort(self) -> None:
        """Close the connection now; a pending or later `read()` raises ConnectionError."""
        self._conn.fail(ConnectionError("aborted by the client"))
        self._conn.abort()
        self._conn.wake()

    async def read_all(self, limit: int) -> bytes:
        """The rest of the body, at most `limit` bytes (an error body)."""
        out = bytearray()
        while len(out) < limit:
            data = await self.read()
            if not data:
                break
            out += data
        return bytes(out[:limit])

    @property
    def complete(self) -> bool:
        return self._conn.finished

    def close(self) -> None:
        """Back to the pool if the response was read to its end, else close the connection."""
        self._disarm()
        if not self._released:
            self._released = True
            self._pool._release(self._conn, reusable=self._conn.finished)


class Pool:
    """Keep-alive connections to one host:port."""

    def __init__(self, host: str, port: int, *, max_connections: int = 512, max_idle: int = 64,
                 idle_timeout_s: float = 4.0, connect_timeout_s: float = 5.0,
                 ssl: ssl_module.SSLContext | None = None) -> None:
        self.host, self.port = host, port
        self.ssl = ssl
        self.max_idle = max_idle
        # Servers close idle keep-alive connections (uvicorn, vLLM's server: after 5 s); one that
        # idled longer is not reused, so a request rarely races the server's close.
        self.idle_timeout_s = idle_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: deque[ResponseProtocol] = deque()
        self._slots = asyncio.Semaphore(max_connections)
        self._open: set[ResponseProtocol] = set()

    async def exchange(self, head: bytes, body: bytes, read_timeout_s: float) -> Exchange:
        """Send one request; returns once the response head arrived."""
        await self._slots.acquire()
        try:
            conn, reused = self._idle_conn(), True
            if conn is None:
                conn, reused = await self._connect(), False
            try:
                return await self._send(conn, head, body, read_timeout_s)
            except ConnectionError:
                if not reused or conn.got_bytes:
                    raise
            conn = await self._connect()  # the idle connection had been closed by the server
            return await self._send(conn, head, body, read_timeout_s)
        except BaseException:
            self._slots.release()
            raise

    async def _send(self, conn: ResponseProtocol, head: bytes, body: bytes, read_timeout_s: float) -> Exchange:
        if conn.transport is None:
            raise ConnectionError("connection has no transport")
        conn.begin()
        conn.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            conn.transport.write(body)
        try:
            async with asyncio.timeout(read_timeout_s):
                await asyncio.shield(conn.head)
        except BaseException:
            self._discard(conn)
            raise
        return Exchange(self, conn, read_timeout_s)

    def _idle_conn(self) -> ResponseProtocol | None:
        now = asyncio.get_running_loop().time()
        while self._idle:
            conn = self._idle.pop()  # most recently used first: the least likely to be closed
            if not conn.closed and now - conn.idle_since < self.idle_timeout_s:
                return conn
            self._discard(conn)
        return None

    async def _connect(self) -> ResponseProtocol:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(lambda: ResponseProtocol(loop), self.host, self.port,
                                                        ssl=self.ssl)
        except TimeoutError:
            raise ConnectionError(f"connecting to {self.host}:{self.port} timed out") from None
        self._open.add(conn)
        return conn

    def _release(self, conn: ResponseProtocol, reusable: bool) -> None:
        self._slots.release()
        if reusable and conn.keep_alive and not conn.closed and len(self._idle) < self.max_idle:
            conn.idle_since = conn.loop.time()
            self._idle.append(conn)
        else:
            self._discard(conn)

    def _discard(self, conn: ResponseProtocol) -> None:
        conn.abort()
        self._open.discard(conn)

    def close(self) -> None:
        for conn in list(self._open):
            self._discard(conn)
        self._idle.clear()
