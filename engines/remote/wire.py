"""The connection side of `engines.remote.http1`: an asyncio.Protocol that parses HTTP/1.1 responses.

One response at a time (`begin()` before each request): the status line and headers resolve
`head`; the body (chunked, Content-Length, or up to EOF) is de-framed into pieces that
`take()` hands over all at once; `waiter` is woken on every arrival. Reading pauses while
more than `HIGH_WATER` bytes wait unread. Pure parsing, no timers: the caller bounds waits.
"""

from __future__ import annotations

import asyncio
from typing import cast

MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE = 1024
HIGH_WATER = 1 << 20  # unread body bytes before the socket stops being read
STATUS, HEADERS, SIZE, DATA, DATA_END, TRAILER, LENGTH, EOF, DONE = range(9)


class ProtocolError(ValueError):
    """The worker's response is not HTTP/1.1 this client can read."""


class ResponseProtocol(asyncio.Protocol):
    """One connection; parses one response at a time into status, headers and body pieces."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.begin()

    def begin(self) -> None:
        self.state = STATUS
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = True
        self.got_bytes = False  # any byte of this response arrived
        self._buf = bytearray()
        self._head_bytes = 0  # of the status line and headers so far (bounded by MAX_HEAD_BYTES)
        self._left = 0  # bytes left in the current chunk, or of a Content-Length body
        self._body: list[bytes] = []
        self._unread = 0
        self._paused = False  # by back-pressure: too much unread
        self._held = False  # by the reader (`hold`): it takes what arrived later, at once
        self.error: BaseException | None = None
        self.last_data_s = self.loop.time()
        self.head = self.loop.create_future()
        self.waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self.last_data_s = self.loop.time()
        if self.state == DONE:
            self.keep_alive = False  # bytes after the response: do not reuse
            return
        try:
            if self.state == SIZE and not self._buf:
                data = self._whole_chunks(data)
            self._buf += data
            self._parse()
        except ProtocolError as e:
            self.fail(e)
            self.abort()
            return
        if self._unread > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            if not self._held:
                self.transport.pause_reading()
        self.wake()

    def eof_received(self) -> bool | None:
        if self.state == EOF:
            self.state = DONE
            self.keep_alive = False
            self.wake()
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.state == EOF:
            self.state = DONE
        elif self.state != DONE:
            self.fail(ConnectionError(f"the worker closed the connection ({exc or 'EOF'})"))
        self.wake()

    # -- parsing -----------------------------------------------------------------
    def _parse(self) -> None:
        buf = self._buf
        while buf:
            st = self.state
            if st in (STATUS, HEADERS, SIZE, DATA_END, TRAILER):
                i = buf.find(b"\r\n")
                if i < 0:
                    if len(buf) > (MAX_HEAD_BYTES if st in (STATUS, HEADERS, TRAILER) else MAX_CHUNK_LINE):
                        raise ProtocolError("response line too long")
                    return
                line = bytes(buf[:i])
                del buf[: i + 2]
                if st in (STATUS, HEADERS):
                    self._head_bytes += i + 2
                    if self._head_bytes > MAX_HEAD_BYTES:
                        raise ProtocolError(f"response head over {MAX_HEAD_BYTES} bytes")
                self._line(st, line)
            elif st in (DATA, LENGTH):
                n = min(self._left, len(buf))
                self._emit(bytes(buf[:n]))
                del buf[:n]
                self._left -= n
                if self._left == 0:
                    self.state = DATA_END if st == DATA else DONE
                    if self.state == DONE:
                        self.wake()
            elif st == EOF:
                self._emit(bytes(buf))
                buf.clear()
            else:  # DONE: trailing bytes
                self.keep_alive = False
                buf.clear()

    def _whole_chunks(self, data: bytes) -> bytes:
        """The complete data chunks at the start of `data` taken at once (a worker writes one event
        per chunk, so this is nearly every read), without the state machine's copies; returns
        the rest, for `_parse`."""
        pos, n, body = 0, len(data), self._body
        while True:
            i = data.find(b"\r\n", pos, pos + MAX_CHUNK_LINE)
            if i < 0:
                break
            size = _chunk_size(data[pos:i])
            start = i + 2
            end = start + size
            if size == 0 or end + 2 > n:
                break  # the last chunk (trailers follow), or one not all here: the state machine's
            if data[end:end + 2] != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
            body.append(data[start:end])
            self._unread += size
            pos = end + 2
        return data[pos:] if pos else data

    def _line(self, st: int, line: bytes) -> None:
        if st == STATUS:
            parts = line.split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise ProtocolError(f"bad status line {line[:80]!r}")
            self.status = int(parts[1])
            self.keep_alive = parts[0] == b"HTTP/1.1"
            self.state = HEADERS
        elif st == HEADERS:
            if line:
                name, sep, value = line.partition(b":")
                if not sep:
                    raise ProtocolError(f"bad header line {line[:80]!r}")
                self.headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
                return
            self._head_complete()
        elif st == SIZE:
            self._left = _chunk_size(line)
            self.state = DATA if self._left else TRAILER
        elif st == DATA_END:
            if line:
                raise ProtocolError("chunk not followed by CRLF")
            self.state = SIZE
        elif not line:  # TRAILER: an empty line ends the message
            self.state = DONE

    def _head_complete(self) -> None:
        h = self.headers
        if "close" in h.get("connection", "").lower():
            self.keep_alive = False
        if "chunked" in h.get("transfer-encoding", "").lower():
            self.state = SIZE
        elif "content-length" in h:
            value = h["content-length"]
            if not value.isdigit():
                raise ProtocolError(f"bad Content-Length {value[:20]!r}")
            self._left = int(value)
            self.state = LENGTH if self._left > 0 else DONE
        elif self.status in (204, 304) or 100 <= self.status < 200:
            self.state = DONE
        else:
            self.state = EOF
            self.keep_alive = False
        if not self.head.done():
            self.head.set_result(None)

    def _emit(self, data: bytes) -> None:
        if data:
            self._body.append(data)
            self._unread += len(data)

    # -- consumer side -----------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        if not self.head.done():
            self.head.set_exception(exc)
            self.head.exception()  # retrieved: a consumer that left early must not warn
        self.keep_alive = False

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def take(self) -> bytes:
        body = self._body
        if not body:
            return b""
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self._unread = 0
        if self._paused and self.transport is not None:
            self._paused = False
            if not self._held:
                self.transport.resume_reading()
        return data

    def hold(self, on: bool) -> None:
        """Stop reading the socket (on) or read it again: what arrives meanwhile waits in the kernel."""
        if on == self._held:
            return
        self._held = on
        if not self._paused and self.transport is not None and not self.closed:
            if on:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    @property
    def finished(self) -> bool:
        return self.state == DONE and not self._body

    def abort(self) -> None:
        self.keep_alive = False
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


def _chunk_size(line: bytes) -> int:
    """The size on a chunk-size line (extensions ignored); ProtocolError if it is not hex."""
    size = line.split(b";", 1)[0].strip()
    if not size or len(size) > 15 or size.strip(b"0123456789abcdefABCDEF"):
        raise ProtocolError(f"bad chunk size {size[:20]!r}")
    return int(size, 16)
