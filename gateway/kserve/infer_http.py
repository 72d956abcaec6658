"""KServe v2 infer over HTTP as a pure ASGI layer: `POST /v2/models/{name}[/versions/{version}]/infer`.

The hottest classic route skips FastAPI's router (which matched every OpenAI and KServe route
in turn, then built a Request and solved dependencies: most of a request's CPU). It sits
inside every middleware (request id, in-flight bound, access log, drain, CORS, access control,
body limits), so each of their guarantees holds unchanged; any other path or scope goes on to
the app. It is the only infer route: it answers what FastAPI's router would for a route of its
own (405 with `Allow: POST` for another method, a redirect for a trailing slash), Triton's error
JSON and status mapping (`errors.ErrorReply`), `Retry-After` on 429/503. Its OpenAPI operations
are written by `gateway/routes/openapi.py`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from functools import partial

from starlette.datastructures import URL
from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from engines.classic.errors import InferError, invalid
from engines.classic.manager import ModelRepositoryManager
from engines.classic.repository.names import check_model_name
from engines.classic.request import InferRequest
from engines.errors import ErrorKind, SluiceError
from gateway.cpu_pool import INLINE_JSON_BYTES, Renderer
from gateway.kserve import views
from gateway.kserve.errors import ErrorReply
from gateway.kserve.http_codec import decode_request, encode_response
from gateway.kserve.views import LLMModels

log = logging.getLogger("sluice.kserve.http")

_INFER = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
_HEADER_LENGTH = b"inference-header-content-length"


@dataclass(frozen=True, slots=True)
class RouteTemplate:
    """What the access log and the request metrics read from `scope["route"]` (as from a Starlette route)."""

    path: str


_ROUTES = (RouteTemplate("/v2/models/{name}/infer"), RouteTemplate("/v2/models/{name}/versions/{version}/infer"))


class KServeInferRoute:
    """Answers every request on the infer paths; anything else goes on to `app`."""

    def __init__(self, app: ASGIApp, manager: ModelRepositoryManager, llms: LLMModels,
                 pool: Renderer | None = None) -> None:
        self.app = app
        self.manager = manager
        self.llms = llms
        self.pool = pool  # decodes a large JSON body off the event loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        match = _INFER.fullmatch(path)
        if match is None:
            if path.endswith("/") and _INFER.fullmatch(path.rstrip("/")):
                # As FastAPI's router answers a trailing slash on any of its routes.
                redirect = RedirectResponse(str(URL(scope={**scope, "path": path.rstrip("/")})))
                await redirect(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        name, version = match.group(1), match.group(2)
        scope["route"] = _ROUTES[version is not None]
        if scope.get("method") != "POST":  # as FastAPI's router answers a route's other methods
            status, headers, body = _reply(ErrorReply(405, "Method Not Allowed", {"Allow": "POST"}))
        else:
            try:
                status, headers, body = await self._infer(scope, receive, name, version or "")
            except SluiceError as exc:
                status, headers, body = _reply(ErrorReply.of(exc))
            except Exception as exc:  # never let one request take the server down
                log.exception("KServe HTTP handler failed")
                error = InferError(f"internal error: {type(exc).__name__}", ErrorKind.INTERNAL)
                status, headers, body = _reply(ErrorReply.of(error))
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _infer(self, scope: Scope, receive: Receive, name: str, version: str
                     ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        m = self.manager
        if views.is_llm(m, self.llms, check_model_name(name)):
            raise invalid(f"model '{name}' is an LLM; use /v2/models/{name}/generate")
        body = await _read(receive)
        header_length = None
        for key, value in scope["headers"]:
            if key.lower() == _HEADER_LENGTH:
                header_length = value.decode("latin-1")
                break
        decode = partial(decode_request, body, header_length, m.limits.max_tensor_elements)
        json_bytes = int(header_length) if header_length is not None and header_length.isdigit() else len(body)
        if self.pool is not None and min(json_bytes, len(body)) > INLINE_JSON_BYTES:
            req = await self.pool.bulk(decode)
        else:
            req = decode()
        model = m.get_version(name, version or None)  # the one lookup: it also names the answer's version
        outputs = await model.infer(InferRequest(name, model.version, req.inputs, req.outputs, priority=req.priority,
                                                 timeout_us=req.timeout_us, request_id=req.request_id,
                                                 parameters=req.parameters))
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


def _reply(reply: ErrorReply) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    return reply.status, reply.raw_headers(), reply.body_bytes()
