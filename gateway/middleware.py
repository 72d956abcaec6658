"""Pure ASGI middleware: request ids, body-size limit, last-resort 500s, access log without prompts;
and the drain gate (`gateway.drain`)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException

from engines.errors import ErrorKind, SluiceError
from gateway.drain import Drain, shutting_down
from gateway.errors import error_bytes

log = logging.getLogger("sluice.access")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
_DRAIN_PASS_THROUGH = frozenset({"/health", "/metrics"})  # probes and scrapes go on while draining


class BodyTooLarge(HTTPException):
    """Raised from `receive`; FastAPI re-raises HTTPExceptions met while reading a
    body, so the app's own error handlers answer 413 in the route's format."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"Request body exceeds the limit of {limit} bytes.")


class SluiceMiddleware:
    """Echoes X-Request-Id, refuses bodies over `max_body_bytes` with 413 (by
    Content-Length, or while streaming a chunked body), answers an exception that
    escapes before the response started with a 500 in the route's protocol, and
    logs one line per request: method, path, status, duration and body size,
    never the body."""

    def __init__(self, app: ASGIApp, max_body_bytes: int,
                 observe: Callable[[str, str, int], None] | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.observe = observe  # (route template, model, status) per finished request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        request_id = headers.get("x-request-id") or uuid.uuid4().hex
        t0 = time.monotonic()
        status = {"code": 0}
        size = {"bytes": 0}
        declared = headers.get("content-length")
        too_large = bool(declared and declared.isdigit() and int(declared) > self.max_body_bytes)

        async def limited_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                size["bytes"] += len(message.get("body", b""))
                if size["bytes"] > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        async def tagged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                hdrs = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                hdrs.append((b"x-request-id", request_id.encode("latin-1")))
                message = {**message, "headers": hdrs}
            await send(message)

        try:
            if too_large:
                raise BodyTooLarge(self.max_body_bytes)
            await self.app(scope, limited_receive, tagged_send)
        except BodyTooLarge:
            if status["code"] == 0:
                status["code"] = await self._too_large(scope, send, request_id)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if status["code"] != 0:
                raise  # the response started: only closing the connection is left
            status["code"] = await self._send_error(scope, send, request_id, SluiceError(
                "The server had an error while processing your request.", ErrorKind.INTERNAL))
        finally:
            code = status["code"] or 500
            if self.observe is not None:
                route = scope.get("route")
                template = getattr(route, "path", None) or "unmatched"
                model = str(scope.get("state", {}).get("sluice_model", ""))
                self.observe(template, model, code)
            log.info("%s %s %s %.1fms body=%dB", scope.get("method"), scope.get("path"), code,
                     (time.monotonic() - t0) * 1000, size["bytes"])

    async def _too_large(self, scope: Scope, send: Send, request_id: str) -> int:
        return await self._send_error(scope, send, request_id, SluiceError(
            f"Request body exceeds the limit of {self.max_body_bytes} bytes.", ErrorKind.TOO_LARGE))

    async def _send_error(self, scope: Scope, send: Send, request_id: str, exc: SluiceError) -> int:
        status, payload, headers = error_bytes(scope.get("path", ""), exc)
        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
               (b"x-request-id", request_id.encode("latin-1"))]
        raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": payload})
        return status


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
