"""The worker key check in front of a worker's routes: a pure ASGI middleware, standard library only.

Every path but the probes' (`/health`, `/metrics`) needs ``Authorization: Bearer <worker key>``;
anything else is answered 401 with an OpenAI-shaped error body and ``WWW-Authenticate: Bearer``,
before the route runs or the body is read. The key is compared as a SHA-256 digest in constant
time and never logged or echoed.

The sim worker and the TensorRT-LLM stand-in add it to their apps. vLLM loads it by import path
(its ``--middleware`` flag) in its own interpreter: the launcher copies this file into the
worker's scratch directory and puts that directory on the child's PYTHONPATH, which is why it
imports nothing outside the standard library. vLLM's own ``--api-key`` check covers only
``/v1``, ``/v2``, ``/inference`` and ``/cohere``, and leaves routes that generate
(``/invocations``) or reveal prompts (``/tokenize``, ``/detokenize``) open; this guard covers them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

KEY_ENV = "VLLM_API_KEY"  # where a guard built without a key reads it (vLLM passes no arguments)
OPEN_PATHS = frozenset({"/health", "/metrics", "/metrics/"})  # probes and Prometheus: no prompt data

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

_BODY = json.dumps({"error": {"message": "this worker needs its worker key: Authorization: Bearer <key>",
                              "type": "invalid_request_error", "param": None, "code": "invalid_worker_key"}}).encode()


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def bearer_token(scope: Scope) -> str | None:
    """The token of the request's `Authorization: Bearer <token>` header, if any."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return (token.strip() or None) if scheme.lower() == "bearer" else None
    return None


class WorkerKeyGuard:
    """Refuses every request without the worker key, except on `OPEN_PATHS`.

    `key` None: read `$VLLM_API_KEY`; when that is unset too the guard passes everything
    (a worker started without a key, on loopback, for local development)."""

    def __init__(self, app: ASGIApp, key: str | None = None) -> None:
        self.app = app
        key = key if key is not None else os.environ.get(KEY_ENV)
        self._digest = _digest(key) if key else None

    def allows(self, scope: Scope) -> bool:
        if self._digest is None or scope.get("path", "") in OPEN_PATHS:
            return True
        token = bearer_token(scope)
        # Digests of equal length: the comparison takes the same time whatever the token is.
        return hmac.compare_digest(_digest(token or ""), self._digest) and token is not None

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] not in ("http", "websocket") or self.allows(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(_BODY)).encode())]})
        await send({"type": "http.response.body", "body": _BODY})
