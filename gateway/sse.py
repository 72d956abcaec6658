"""Server-sent events shared by the OpenAI and KServe streaming routes.

A stream ends with its protocol's terminator, or with an error event first, never by hanging.
A client that stops reading never makes the stream wait: the HTTP protocol cuts its connection
after the write deadline or the buffer bound (gateway.http.flow), which ends the stream as a
disconnect does.
`SSEResponse` sends `: ping` comments while nothing else was sent for `ping_s` (queue, prefill),
and stops the stream when the client disconnects: it closes the event source, which closes the
engine stream, which aborts the engine request. Per event it does one ASGI send of bytes that
are already framed; the timers (ping, disconnect) are per response, not per event.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from engines.errors import SluiceError

log = logging.getLogger("sluice.sse")

_PING = b": ping\n\n"
# Offered by Sluice's HTTP protocol (gateway.http.protocol): `begin()` marks the response a stream,
# whose kernel send buffer is then kept small, so a client that stops reading meets the write bounds.
STREAM_EXTENSION = "sluice.stream"


class SSEResponse(Response):
    """A text/event-stream response over an async iterator of framed events (bytes)."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], *, ping_s: float, headers: Mapping[str, str] | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        # Not Response.__init__: with no body it would declare Content-Length: 0.
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-store", "X-Accel-Buffering": "no", **(headers or {})})
        self.events = events
        self.ping_s = max(ping_s, 0.05)
        self.on_close = on_close
        self._last_send_s = 0.0
        self._started = False
        self._sending = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        begin = scope.get("extensions", {}).get(STREAM_EXTENSION, {}).get("begin")
        if begin is not None:
            begin()
        streaming = asyncio.ensure_future(self._stream(send))
        watchers = [asyncio.ensure_future(_disconnected(receive)), asyncio.ensure_future(self._ping(send))]
        try:
            await asyncio.wait({streaming, watchers[0]}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (streaming, *watchers):
                task.cancel()
            await asyncio.gather(streaming, *watchers, return_exceptions=True)
            try:
                await self.events.aclose()  # type: ignore[attr-defined]
            finally:
                if self.on_close is not None:
                    self.on_close()
        if streaming.done() and not streaming.cancelled() and streaming.exception() is not None:
            exc = streaming.exception()
            if not isinstance(exc, OSError):  # the client went away while we wrote
                raise exc  # type: ignore[misc]

    async def _stream(self, send: Send) -> None:
        loop = asyncio.get_running_loop()
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        self._last_send_s = loop.time()
        self._started = True
        async for data in self.events:
            self._sending = True
            await send({"type": "http.response.body", "body": data, "more_body": True})
            self._sending = False
            self._last_send_s = loop.time()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _ping(self, send: Send) -> None:
        """A comment whenever nothing was sent for `ping_s`; wakes about once per `ping_s`."""
        loop = asyncio.get_running_loop()
        while True:
            wait_s = self._last_send_s + self.ping_s - loop.time()
            if wait_s > 0 or not self._started or self._sending:
                await asyncio.sleep(wait_s if wait_s > 0 else self.ping_s)
                continue
            self._sending = True
            try:
                await send({"type": "http.response.body", "body": _PING, "more_body": True})
            finally:
                self._sending = False
            self._last_send_s = loop.time()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def dumps(payload: Any) -> bytes:
    """A JSON payload as one event's bytes (every SSE route frames with it)."""
    if isinstance(payload, bytes):
        return payload
    try:
        return orjson.dumps(payload)
    except TypeError:  # what orjson cannot encode (an int over 64 bits): the standard library can
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def relay(events: AsyncIterator[dict[str, Any] | bytes], *,
          error_body: Callable[[BaseException], dict[str, Any]], done: str | None, ping_s: float,
          headers: Mapping[str, str] | None = None, on_close: Callable[[], None] | None = None) -> SSEResponse:
    """JSON payloads (dicts, or JSON already encoded as bytes) as `data:` events. A failure after
    the first byte becomes one error event (the status code is gone by then); `done` (e.g.
    "[DONE]") is sent last."""

    async def gen() -> AsyncGenerator[bytes, None]:
        try:
            async with aclosing(events) as it:  # type: ignore[type-var]
                async for payload in it:
                    yield b"data: " + dumps(payload) + b"\n\n"
        except Exception as e:
            if not isinstance(e, SluiceError):
                log.exception("stream failed")
            yield b"data: " + dumps(error_body(e)) + b"\n\n"
        if done is not None:
            yield b"data: " + done.encode() + b"\n\n"

    return SSEResponse(gen(), ping_s=ping_s, headers=headers, on_close=on_close)
