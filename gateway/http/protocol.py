"""uvicorn's HTTP protocol with Sluice's bounds, enforced per connection before the app runs.

- **Header time.** uvicorn bounds idle keep-alive connections but not a request's header phase:
  a connection whose request headers are not complete `header_timeout_s` after it opened or the
  request's first byte arrived is closed.
- **Keep-alive.** A connection idle between requests is closed after `keep_alive_timeout_s` (75 s),
  well past the clients' own idle expiry (httpx, and so the OpenAI SDKs: 5 s). With equal timeouts a
  client reuses a connection the moment the server closes it, and its request is lost to a reset.
- **Header size.** httptools (llhttp) bounds neither the size nor the number of headers: more than
  `max_header_bytes` of request line and headers, or more than `max_header_count` header fields,
  is answered 431 with a JSON error in the route's protocol and the connection is closed, before
  authentication and before the headers are turned into a request.
- **Idle connections**: kept-alive ones are bounded per client and in total; fresh ones (no
  request yet) in total only, the biggest holder's closed first (`gateway.http.connections`).
  Both give way when a new connection would take the fds busy connections need
  (`gateway.http.budgets`).
- **Writes** never wait on a client that stops reading (`gateway.http.flow`); a streamed response
  (SSE) also caps the kernel's send buffer, so that the bounds apply after kilobytes, not megabytes.

Every connection the server closes here is counted by reason (`ConnectionMetrics`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from prometheus_client import CollectorRegistry
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.http.budgets import FdBudget
from gateway.http.connections import (
    ConnectionLimits,
    ConnectionMetrics,
    FreshConnections,
    IdleConnections,
    client_key,
)
from gateway.http.error_handlers import status_error_bytes
from gateway.http.flow import BoundedFlow
from gateway.sse import STREAM_EXTENSION

log = logging.getLogger("sluice.server")
_STATUS_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
_LINGER_S = 2.0  # after a 431: how long the rest of a refused request is read and dropped


class _HeadersTooLarge(Exception):
    """Raised from a parser callback to stop parsing; httptools re-raises it wrapped."""


class SluiceHttpProtocol(HttpToolsProtocol):
    # Set per server by `build_protocol`.
    limits: ConnectionLimits = ConnectionLimits()
    idle: IdleConnections = IdleConnections(256, 4096)
    fresh: FreshConnections = FreshConnections(16384)
    budget: FdBudget | None = None
    metrics: ConnectionMetrics | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._client_key = ""
        self._in_head = True  # between a request's start (or the connection's) and its complete headers
        self._head_raw = 0  # bytes read in this head after the read that began it (a bound on the parser's buffer)
        self._head_bytes = 0  # request line + header names and values, as parsed
        self._head_count = 0
        self._body_done = True  # the request's body read to its end (or no request begun)
        self._refusal: str | None = None
        self._lingering = False
        self._kept_alive = False  # idle between requests: the keep-alive timer runs, not the header one

    # -- connection ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.limits
        self.flow = BoundedFlow(transport, self.loop, limits.write_timeout_s, limits.max_buffer_bytes,
                                self._slow_reader)
        self._client_key = client_key(self.client)
        self._arm()
        self.fresh.add(self, self._client_key)  # not held to the kept-alive bound per client
        if self.budget is not None:
            self.budget.opened()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.idle.discard(self)
        self.fresh.discard(self)
        if self.budget is not None:
            self.budget.closed()
        super().connection_lost(exc)

    def close_idle(self) -> None:
        """Closed as the oldest idle connection past a bound (`IdleConnections`, `FreshConnections`)."""
        if not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if (not self._body_done and not self._in_head and not self.transport.is_closing()
                and self.cycle is not None and self.cycle.response_complete):
            # Answered before its body was read (401, 429, 503): the rest of the body is dropped as
            # it arrives, and must arrive within the body timeout; it is not the next request's head.
            self._arm(self.limits.body_timeout_s, "body_timeout")
        self._idle_if_answered()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._body_done = True
        self._disarm()  # a body timer, if the request was answered early
        self._idle_if_answered()

    def _idle_if_answered(self) -> None:
        if (self._body_done and not self.transport.is_closing()
                and (self.cycle is None or self.cycle.response_complete)):
            # Request read and answered, no pipelined request started: idle until the next one, whose
            # headers must be complete within the header timeout (data that begins no request, such
            # as bare CRLFs, would otherwise keep resetting uvicorn's keep-alive timer).
            self._in_head = True
            self._head_raw = 0
            self._disarm()
            self._arm(self.limits.keep_alive_timeout_s, "keep_alive")
            self._kept_alive = True
            self.idle.add(self, self._client_key)

    # -- the head of a request ----------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._lingering:  # refused: what follows is dropped unread
            return
        if self._kept_alive:  # the next request's first bytes: its headers have the header timeout
            self._kept_alive = False
            self._disarm()
            self._arm()
        if self._in_head:
            if self._head_raw > self.limits.max_header_bytes:  # one header still arriving, already too long
                self._refuse("header_bytes")
                return
            self._head_raw += len(data)
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # The app tells a streamed response from others (gateway.sse): see `_stream_begins`.
        self.scope["extensions"] = {STREAM_EXTENSION: {"begin": self._stream_begins}}
        self._in_head, self._body_done = True, False
        self._head_raw = self._head_bytes = self._head_count = 0
        self._arm()

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value), 1)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_head = False
        self.idle.discard(self)
        self.fresh.discard(self)
        super().on_headers_complete()

    def _count(self, size: int, fields: int) -> None:
        self._head_bytes += size
        self._head_count += fields
        if self._head_bytes > self.limits.max_header_bytes:
            self._refusal = "header_bytes"
        elif self._head_count > self.limits.max_header_count:
            self._refusal = "header_count"
        else:
            return
        raise _HeadersTooLarge  # uvicorn's data_received turns the parser error into send_400_response

    def send_400_response(self, msg: str) -> None:
        if self._refusal is None:
            super().send_400_response(msg)
        else:
            self._refuse(self._refusal)

    def _refuse(self, reason: str) -> None:
        """431 in the protocol of the path asked for, then close."""
        self._refusal = reason
        self._disarm()
        if self.transport.is_closing() or self._lingering:
            return
        limits = self.limits
        message = (f"The request line and headers exceed {limits.max_header_bytes} bytes."
                   if reason == "header_bytes" else f"The request has more than {limits.max_header_count} "
                                                    "header fields.")
        path = getattr(self, "url", b"").partition(b"?")[0].decode("latin-1")
        body = status_error_bytes(path, 431, message, code="request_header_fields_too_large")
        self.transport.write(b"".join([_STATUS_431, b"content-type: application/json\r\ncontent-length: ",
                                       str(len(body)).encode(), b"\r\nconnection: close\r\n\r\n", body]))
        self._closed(reason)
        # A lingering close, as nginx does: closing with the rest of the client's headers unread
        # would reset the connection, and the client could lose the answer. Send it, half-close,
        # and drop what still arrives until the client closes, for `_LINGER_S` at most.
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(_LINGER_S, self.transport.close)

    def _stream_begins(self) -> None:
        """A stream keeps the kernel's send buffer small: autotuned, it would take megabytes from a
        client that does not read before the transport pauses and the write bounds apply."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.stream_send_buffer)
            except OSError:
                pass

    # -- timers and counts --------------------------------------------------------------------
    def _arm(self, timeout_s: float | None = None, reason: str = "header_timeout") -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.limits.header_timeout_s if timeout_s is None else timeout_s,
                                                      self._too_slow, reason)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self, reason: str) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()
            self._closed(reason)

    def _closed(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.closed.labels(reason).inc()

    def _slow_reader(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.slow_reader.labels("http", reason).inc()
        host = self.client[0] if self.client else "?"
        log.info("client %s stopped reading (%s): connection closed", host, reason)


def build_protocol(limits: ConnectionLimits, registry: CollectorRegistry | None = None,
                   fd_limit: int | None = None) -> type[SluiceHttpProtocol]:
    """The protocol class of one server: its limits, its idle-connection tables, its fd budget (when
    `fd_limit` is given) and its metrics."""
    cls: type[SluiceHttpProtocol] = type("SluiceHttpProtocol", (SluiceHttpProtocol,), {"limits": limits})
    idle = IdleConnections(limits.max_idle_per_client, limits.max_idle_total)
    fresh = FreshConnections(limits.max_fresh_total)
    metrics = ConnectionMetrics(registry, idle, fresh)
    idle.on_evict = fresh.on_evict = lambda reason: metrics.closed.labels(reason).inc()
    cls.idle, cls.fresh = idle, fresh
    cls.budget = FdBudget(fd_limit, idle, fresh) if fd_limit else None
    cls.metrics = metrics
    return cls
