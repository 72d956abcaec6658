"""The HTTP edge of access control: a pure ASGI middleware in front of every route.

It classifies the path (`gateway.security.access`), authenticates the bearer key
before the route runs or the body is read, and admits API requests through the
key's quotas, holding the concurrency slot until the response has been sent
(a stream holds it until it ends). Refusals are answered in the route's own
protocol by `render` (OpenAI JSON or KServe JSON), with `WWW-Authenticate` on a
401 and `Retry-After` on a 429.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from engines.errors import SluiceError
from gateway.security.access import (
    ADMIN,
    SCOPE_ACCESS,
    SCOPE_ADMIN_SCOPES,
    SCOPE_KEY_ID,
    Access,
    bearer,
    browser_refusal,
    classify_path,
    current_key_id,
    is_local,
)
from gateway.security.guard import Security

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Render = Callable[[str, SluiceError], tuple[int, bytes, dict[str, str]]]  # (path, error) -> status, body, headers


class AccessMiddleware:
    def __init__(self, app: ASGIApp, security: Security, render: Render) -> None:
        self.app = app
        self.security = security
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # no route speaks it: refuse the handshake rather than pass it unchecked
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        access = classify_path(scope.get("path", ""))
        authorization = api_key = None
        for raw_name, raw_value in scope.get("headers", []):
            name = raw_name.lower()
            if authorization is None and name == b"authorization":
                authorization = raw_value.decode("latin-1")
            elif api_key is None and name == b"x-api-key":  # Anthropic's SDKs send the key so
                api_key = raw_value.decode("latin-1").strip() or None
        lease = None
        try:
            # Only admin routes care whether the peer is local: its address and headers are read for them alone.
            local, not_local = _is_local(scope) if access in ADMIN else (False, None)
            token = bearer(authorization) if authorization is not None else api_key
            principal = self.security.authenticate(access, token, local=local, not_local=not_local)
            if access is Access.API and principal is not None:
                lease = await self.security.quotas.admit(principal.id)
                scope[SCOPE_KEY_ID] = principal.id
            if access in ADMIN and principal is not None:  # a registration key names only its own address
                scope[SCOPE_ADMIN_SCOPES] = principal.scopes
        except SluiceError as e:
            await self._refuse(scope, send, e)
            return
        scope[SCOPE_ACCESS] = access.value
        # The key, for code below that sees no scope (the CPU pool's per-key share of its bulk threads).
        token = current_key_id.set(scope.get(SCOPE_KEY_ID))
        try:
            await self.app(scope, receive, send)
        finally:
            current_key_id.reset(token)
            if lease is not None:
                self.security.quotas.finish(lease)

    async def _refuse(self, scope: Scope, send: Send, exc: SluiceError) -> None:
        status, payload, headers = self.render(scope.get("path", ""), exc)
        if status == 401:  # RFC 9110: a 401 names its scheme, on KServe routes too
            headers = {"WWW-Authenticate": "Bearer", **{k: v for k, v in headers.items()
                                                        if k.lower() != "www-authenticate"}}
        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": payload})


def _is_local(scope: Scope) -> tuple[bool, str | None]:
    """Whether the peer is direct loopback, and why a loopback request may still be a browser's."""
    client = scope.get("client")
    headers = {raw_name.decode("latin-1").lower(): raw_value.decode("latin-1")
               for raw_name, raw_value in scope.get("headers", [])}
    local = is_local(client[0] if client else None, set(headers))
    return local, browser_refusal(headers.get("origin"), headers.get("host")) if local else None
