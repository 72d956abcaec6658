"""Write bounds of one HTTP connection: the app never waits on a client that stops reading.

uvicorn's flow control makes the app's `send()` wait while the transport's buffer is past its
high-water mark (64 KiB), for as long as the client does not read: an SSE stream then holds its
engine request, its admission slot and the chain behind it (the in-process engine's output
queue, a worker's connection) for ever. `BoundedFlow` replaces that wait. `send()` never
blocks: bytes written while the client does not read stay queued in the transport, and the
connection is cut (reset, so the kernel drops what it holds too) when

- the client has not taken a write for `write_timeout_s` (the transport stayed paused that long;
  reason `write_timeout`), or
- more than `max_buffer_bytes` were queued since it paused (reason `buffer`).

The cut closes the connection; an error event could not reach a client that does not read. The
app sees `http.disconnect`, and an SSE response ends as for a client that left: its event source
is closed, which aborts the engine request and frees its slot (`gateway.sse`). Timers exist only
while a connection is paused, so a client that reads costs nothing here.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable

from uvicorn.protocols.http.flow_control import FlowControl

_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets and drops unsent bytes


class BoundedFlow(FlowControl):
    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, write_timeout_s: float,
                 max_buffer_bytes: int, on_cut: Callable[[str], None]) -> None:
        super().__init__(transport)
        self._loop = loop
        self._write_timeout_s = write_timeout_s
        self._max_buffer_bytes = max_buffer_bytes
        self._on_cut = on_cut
        self._timer: asyncio.TimerHandle | None = None
        self._paused_at = 0  # the transport's buffered bytes when it paused

    def pause_writing(self) -> None:
        if not self.write_paused:
            super().pause_writing()
            self._paused_at = self._transport.get_write_buffer_size()
            self._timer = self._loop.call_later(self._write_timeout_s, self.cut, "write_timeout")

    def resume_writing(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().resume_writing()

    async def drain(self) -> None:
        """uvicorn's `send()` calls this while paused, before it writes: instead of waiting for the
        client, cut a connection that has queued too much since it paused."""
        if self._transport.get_write_buffer_size() - self._paused_at > self._max_buffer_bytes:
            self.cut("buffer")
            await asyncio.sleep(0)  # connection_lost runs first, so that send() writes nothing more

    def cut(self, reason: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        transport = self._transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            except OSError:
                pass
        transport.abort()
        self._on_cut(reason)
