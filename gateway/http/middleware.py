"""Pure ASGI middleware: request ids, body limits, in-flight bound, last-resort 500s, access log without
prompts; and the drain gate (`gateway.drain`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from engines.errors import ErrorKind, SluiceError
from gateway.cpu_pool import INLINE_JSON_BYTES, Renderer
from gateway.drain import Drain, shutting_down
from gateway.http.error_handlers import error_bytes
from gateway.limits import BodyTooLarge, check_json_depth, read_body
from gateway.telemetry import context

log = logging.getLogger("sluice.access")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
BODY_BYTES = "sluice_body_bytes"  # scope state: the body's size on the wire, for the access log
_DRAIN_PASS_THROUGH = frozenset({"/health", "/metrics"})  # probes and scrapes go on while draining



class SluiceMiddleware:
    """The outermost layer: refuses more than `max_inflight` concurrent requests (503),
    makes the request's context current (`gateway.telemetry.context`: its request id, the client's
    well-formed X-Request-Id or a fresh one, sent back as X-Request-Id on every response, and its
    trace parent), answers an exception that escapes before the response started
    with a 500 in the route's protocol, and logs one line per request: method, path,
    status, duration and body size, never the body."""

    def __init__(self, app: ASGIApp, max_inflight: int = 1024,
                 observe: Callable[[str, str, int], None] | None = None, frontend: int | None = None) -> None:
        self.app = app
        self.max_inflight = max_inflight
        self.inflight = 0
        self.observe = observe  # (route template, model, status) per finished request
        # `--frontends N`: every response names the frontend that answered it (X-Sluice-Frontend).
        self._frontend = None if frontend is None else (b"x-sluice-frontend", str(frontend).encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._frontend is not None:
            send = partial(_named, send, self._frontend)
        ctx = _context(scope)
        request_id = ctx.request_id
        t0 = time.monotonic()
        status = {"code": 0}
        seen: dict[str, Any] = {"request_id": request_id}

        async def tagged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                hdrs = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                hdrs.append((b"x-request-id", request_id.encode("latin-1")))
                message = {**message, "headers": hdrs}
                worker = next((v for k, v in hdrs if k.lower() == b"x-sluice-worker"), None)
                if worker is not None:
                    seen["worker"] = worker.decode("latin-1")
            elif message["type"] == "http.response.body" and "ttfb_ms" not in seen and message.get("body"):
                seen["ttfb_ms"] = round((time.monotonic() - t0) * 1000, 1)
            await send(message)

        scope.setdefault("state", {})  # where the inner layers leave what the access log reports
        self.inflight += 1
        token = context.enter(ctx)  # every log line until the access line carries its ids
        try:
            if self.inflight > self.max_inflight:
                raise SluiceError(f"The server is handling {self.max_inflight} requests; retry later.",
                                  ErrorKind.OVERLOADED, code="server_busy", retry_after_s=1.0)
            await self.app(scope, receive, tagged_send)
        except SluiceError as e:  # refused before the app ran
            if status["code"] != 0:
                raise
            status["code"] = await send_error(scope, send, e, request_id)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if status["code"] != 0:
                raise  # the response started: only closing the connection is left
            status["code"] = await send_error(scope, send, SluiceError(
                "The server had an error while processing your request.", ErrorKind.INTERNAL), request_id)
        finally:
            self.inflight -= 1
            self._finished(scope, status["code"] or 500, t0, seen)
            context.leave(token)

    def _finished(self, scope: Scope, code: int, t0: float, seen: dict[str, Any]) -> None:
        route = scope.get("route")
        template = getattr(route, "path", None) or "unmatched"
        model = str(scope.get("state", {}).get("sluice_model", ""))
        if self.observe is not None:
            self.observe(template, model, code)
        if not log.isEnabledFor(logging.INFO):  # the line below costs more than the request's own bookkeeping
            return
        duration_ms = round((time.monotonic() - t0) * 1000, 1)
        size = int(scope.get("state", {}).get(BODY_BYTES, 0))
        # The access line: sizes and timings, never a body. `extra` feeds --log-format json.
        log.info("%s %s %s %.1fms body=%dB", scope.get("method"), scope.get("path"), code, duration_ms, size,
                 extra={**seen, "method": scope.get("method"), "path": scope.get("path"), "route": template,
                        "status": code, "model": model or None, "duration_ms": duration_ms, "body_bytes": size})


async def _named(send: Send, header: tuple[bytes, bytes], message: Message) -> None:
    if message["type"] == "http.response.start":
        message = {**message, "headers": [*message.get("headers", []), header]}
    await send(message)


def _context(scope: Scope) -> context.RequestContext:
    """The request's context from its X-Request-Id, traceparent and tracestate headers. Several
    request ids or traceparents make it invalid (ignored); several tracestates are one list."""
    found: dict[bytes, list[bytes]] = {}
    for key, value in scope.get("headers", ()):
        key = key.lower()
        if key in _CONTEXT_HEADERS:
            found.setdefault(key, []).append(value)

    def one(name: bytes) -> str | None:
        values = found.get(name, [])
        return values[0].decode("latin-1") if len(values) == 1 else None

    states = found.get(b"tracestate")
    return context.from_headers(one(b"x-request-id"), one(b"traceparent"),
                                b",".join(states).decode("latin-1") if states else None)


_CONTEXT_HEADERS = frozenset({b"x-request-id", b"traceparent", b"tracestate"})


def _header(scope: Scope, name: bytes) -> str | None:
    """The last value of header `name` (lower-case), as a dict of every header would keep, without one."""
    found = None
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            found = value
    return None if found is None else str(found.decode("latin-1"))


async def send_error(scope: Scope, send: Send, exc: SluiceError, request_id: str | None = None) -> int:
    """Answer `exc` in the protocol of the route at the scope's path; returns the status sent."""
    status, payload, headers = error_bytes(scope.get("path", ""), exc)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if request_id is not None:
        raw.append((b"x-request-id", request_id.encode("latin-1")))
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
    return status


class BodyLimitMiddleware:
    """Inside access control (a stranger cannot make the server read or inflate a body):
    reads the body within `max_body_bytes` (413, by Content-Length or while reading; gzip and
    deflate bodies are inflated within the same bound), within `body_timeout_s`, and refuses
    JSON nested too deep (400). The app then reads the checked body as if it had been sent plain."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float = 30.0,
                 pool: Renderer | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.pool = pool  # checks a large body's depth off the event loop (seconds for 8 MiB of brackets)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            scope, replay, size = await self._prepare(scope, receive)
        except SluiceError as e:
            await send_error(scope, send, e)
            return
        scope.setdefault("state", {})[BODY_BYTES] = size
        await self.app(scope, replay, send)

    async def _prepare(self, scope: Scope, receive: Receive) -> tuple[Scope, Receive, int]:
        """The scope and a `receive` that replays the checked body, and the body's wire size."""
        declared = _header(scope, b"content-length") or ""
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise BodyTooLarge(self.max_body_bytes)
        encoding = _header(scope, b"content-encoding") or ""
        try:
            async with asyncio.timeout(self.body_timeout_s):
                body, wire = await read_body(receive, encoding, self.max_body_bytes)
        except TimeoutError:
            raise SluiceError(f"The request body did not arrive within {self.body_timeout_s:g} s.",
                              ErrorKind.INVALID_ARG) from None
        if "json" in (_header(scope, b"content-type") or ""):
            if self.pool is not None and len(body) > INLINE_JSON_BYTES:
                await self.pool.bulk(partial(check_json_depth, body))
            else:
                check_json_depth(body)
        if encoding.strip().lower() not in ("", "identity"):
            # The app sees the inflated body as if it had been sent plain.
            kept = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in
                    (b"content-encoding", b"content-length")]
            scope = {**scope, "headers": [*kept, (b"content-length", str(len(body)).encode())]}
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: only the disconnect is left to see

        return scope, replay, wire

class DrainMiddleware:
    """Counts requests in flight; while draining, answers new ones 503 with Retry-After and
    `Connection: close` in the route's protocol (see `gateway.drain`)."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in _DRAIN_PASS_THROUGH:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            await _refuse_draining(scope, send)
            return
        self.drain.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.exit()


async def _refuse_draining(scope: Scope, send: Send) -> None:
    status, payload, headers = error_bytes(scope.get("path", ""), shutting_down())
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
           (b"connection", b"close")]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
