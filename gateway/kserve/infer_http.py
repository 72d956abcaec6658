"""KServe v2 infer over HTTP as a pure ASGI layer: `POST /v2/models/{name}[/versions/{version}]/infer`.

The hottest classic route skips FastAPI's router (which matched every OpenAI and KServe route
in turn, then built a Request and solved dependencies: most of a request's CPU). It sits
inside every middleware (request id, in-flight bound, access log, drain, CORS, access control,
body limits), so each of their guarantees holds unchanged; any other path, method or scope goes
on to the app. Answers are the same as the FastAPI route's (`http.py`), bytes for bytes:
the same decode/encode (`http_infer.py`), Triton's error JSON and status mapping,
`Retry-After` on 429/503.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from engines.classic.errors import Code, InferError, invalid
from engines.classic.manager import ModelRepositoryManager
from engines.classic.repository.names import check_model_name
from engines.errors import SluiceError
from gateway.kserve import views
from gateway.kserve.errors import http_status, retry_headers
from gateway.kserve.http_codec import decode_request, encode_response

log = logging.getLogger("sluice.kserve.http")
Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_INFER = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
_HEADER_LENGTH = b"inference-header-content-length"


@dataclass(frozen=True, slots=True)
class RouteTemplate:
    """What the access log and the request metrics read from `scope["route"]` (as from a Starlette route)."""

    path: str


_ROUTES = (RouteTemplate("/v2/models/{name}/infer"), RouteTemplate("/v2/models/{name}/versions/{version}/infer"))


class KServeInferRoute:
    def __init__(self, app: ASGIApp, manager: ModelRepositoryManager, llm: Any) -> None:
        self.app = app
        self.manager = manager
        self.llm = llm

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = _INFER.fullmatch(scope["path"]) if scope["type"] == "http" else None
        if match is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        name, version = match.group(1), match.group(2)
        scope["route"] = _ROUTES[version is not None]
        try:
            status, headers, body = await self._infer(scope, receive, name, version or "")
        except SluiceError as exc:
            status, headers, body = _error(exc)
        except Exception as exc:  # never let one request take the server down
            log.exception("KServe HTTP handler failed")
            status, headers, body = _error(InferError(f"internal error: {type(exc).__name__}", Code.INTERNAL))
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _infer(self, scope: Scope, receive: Receive, name: str, version: str
                     ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        m = self.manager
        if views.is_llm(m, self.llm, check_model_name(name)):
            raise invalid(f"model '{name}' is an LLM; use /v2/models/{name}/generate")
        body = await _read(receive)
        header_length = None
        for key, value in scope["headers"]:
            if key.lower() == _HEADER_LENGTH:
                header_length = value.decode("latin-1")
                break
        req = decode_request(body, header_length, m.limits.max_tensor_elements)
        model = m.get_version(name, version or None)
        outputs = await m.infer(name, model.version, req.inputs, req.outputs, req.priority, req.timeout_us,
                                req.parameters, req.request_id)
        payload, json_length = encode_response(name, model.version, req, outputs)
        if json_length is None:
            return 200, [(b"content-type", b"application/json")], payload
        return 200, [(b"content-type", b"application/octet-stream"),
                     (b"inference-header-content-length", str(json_length).encode())], payload


async def _read(receive: Receive) -> bytes:
    """The body as Starlette's `Request.body()` reads it (the body limit layer already bounded it)."""
    parts = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away: an empty body, as Starlette would give
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _error(exc: SluiceError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    headers = [(b"content-type", b"application/json")]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in retry_headers(exc).items()]
    return http_status(exc), headers, orjson.dumps({"error": exc.message})
