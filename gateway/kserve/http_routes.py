"""KServe v2 over HTTP as a FastAPI APIRouter: health, metadata, config, stats, repository, generate.

Infer, the hottest route, is not here: it is the pure-ASGI layer in `infer_http.py`, in front of
this router (its OpenAPI operations are written by `gateway/routes/openapi.py`).

Errors are Triton's `{"error": "..."}` with Triton's status mapping (400 bad
input, 404 unknown model/version, 503 unavailable / queue full / timeout, 500
model failure). A bad request never affects other requests.
"""

from __future__ import annotations

import base64
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from engines.classic.errors import InferError, invalid
from engines.classic.manager import ModelRepositoryManager
from engines.classic.repository.names import check_model_name
from engines.errors import ErrorKind, SluiceError
from gateway import json_body
from gateway.app_state import state_of
from gateway.frontends import channel
from gateway.kserve import generate, views
from gateway.kserve.errors import ErrorReply
from gateway.kserve.views import LLMModels
from gateway.llm.service import LLMService
from gateway.security.access import key_id_of, require_admin

log = logging.getLogger("sluice.kserve.http")


def error_response(exc: SluiceError) -> JSONResponse:
    reply = ErrorReply.of(exc)
    return JSONResponse(reply.body(), status_code=reply.status, headers=reply.headers)


async def guarded(call: Callable[[], Awaitable[Response] | Response]) -> Response:
    """Turn InferError (and any unexpected failure) into Triton's error JSON."""
    try:
        result = call()
        return await result if inspect.isawaitable(result) else result
    except SluiceError as exc:
        return error_response(exc)
    except Exception as exc:  # never let one request take the server down
        log.exception("KServe HTTP handler failed")
        return error_response(InferError(f"internal error: {type(exc).__name__}", ErrorKind.INTERNAL))


async def read_json(request: Request) -> dict[str, Any]:
    # The middleware already bounded the body and inflated gzip/deflate; a large one is parsed off the loop.
    data: dict[str, Any] = await json_body.read_json(request, _json_object)
    return data


def _json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: arrays or objects nested too deeply
        raise invalid(f"failed to parse the request JSON: {exc}") from None
    if not isinstance(data, dict):
        raise invalid("the request body must be a JSON object")
    return data


async def _stats(m: ModelRepositoryManager, request: Request, name: str, version: str) -> Response:
    snaps = await channel.statistics(m, state_of(request).peers, name, version)
    return _json(views.to_dict(views.statistics_response(snaps)))


def build_router(manager: ModelRepositoryManager, llm: LLMService) -> APIRouter:
    router = APIRouter()
    _server_routes(router, manager)
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        _model_routes(router, prefix, manager, llm)
    _repository_routes(router, manager, llm.registry)
    return router


def _server_routes(router: APIRouter, m: ModelRepositoryManager) -> None:
    @router.get("/v2")
    async def server_metadata() -> Response:
        return JSONResponse(views.to_dict(views.server_metadata()))

    @router.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @router.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(status_code=200 if m.ready() else 503)

    @router.get("/v2/models/stats")
    async def all_stats(request: Request) -> Response:
        return await guarded(lambda: _stats(m, request, "", ""))


def _repository_routes(router: APIRouter, m: ModelRepositoryManager, llms: LLMModels) -> None:
    @router.post("/v2/repository/index")
    async def index(request: Request) -> Response:
        async def run() -> Response:
            ready = (await read_json(request)).get("ready", False)
            if not isinstance(ready, bool):  # bool("false") is True
                raise invalid("'ready' must be a boolean")
            return _json(views.repository_index(m, llms, ready))
        return await guarded(run)

    # Admin only: the access middleware authenticates the admin key; the dependency fails closed.
    @router.post("/v2/repository/models/{name}/load", dependencies=[Depends(require_admin)])
    async def load(name: str, request: Request) -> Response:
        async def run() -> Response:
            check_model_name(name)
            params = (await read_json(request)).get("parameters") or {}
            if not isinstance(params, dict):
                raise invalid("'parameters' must be a JSON object")
            config = params.get("config")
            files = {}
            for key, value in params.items():
                if key.startswith("file:"):
                    try:
                        files[key[5:]] = base64.b64decode(value, validate=True)
                    except (ValueError, TypeError):
                        raise invalid(f"parameter '{key}' must be base64-encoded file content") from None
            await m.load(name, config, files)
            return Response(status_code=200)
        return await guarded(run)

    @router.post("/v2/repository/models/{name}/unload", dependencies=[Depends(require_admin)])
    async def unload(name: str, request: Request) -> Response:
        async def run() -> Response:
            check_model_name(name)
            await read_json(request)
            await m.unload(name)
            return Response(status_code=200)
        return await guarded(run)


def _json(data: Any, status: int = 200) -> Response:
    return JSONResponse(data, status_code=status)


def _model_routes(router: APIRouter, prefix: str, m: ModelRepositoryManager, llm: LLMService) -> None:
    llms = llm.registry
    @router.get(prefix)
    async def metadata(name: str, version: str = "") -> Response:
        return await guarded(lambda: _json(views.to_dict(views.model_metadata(m, llms, name, version))))

    @router.get(prefix + "/ready")
    async def model_ready(name: str, version: str = "") -> Response:
        return await guarded(lambda: Response(status_code=200 if views.model_ready(m, llms, name, version) else 400))

    @router.get(prefix + "/config")
    async def config(name: str, version: str = "") -> Response:
        return await guarded(lambda: _json(views.to_dict(views.model_config(m, llms, name, version))))

    @router.get(prefix + "/stats")
    async def stats(name: str, request: Request, version: str = "") -> Response:
        return await guarded(lambda: _stats(m, request, name, version))

    @router.post(prefix + "/generate")
    async def gen(name: str, request: Request, version: str = "") -> Response:
        async def run() -> Response:
            check_model_name(name)
            return _json(await generate.generate_once(llm, state_of(request).renderer, name, version,
                                                      await read_json(request), key_id_of(request)))
        return await guarded(run)

    @router.post(prefix + "/generate_stream")
    async def gen_stream(name: str, request: Request, version: str = "") -> Response:
        async def run() -> Response:
            check_model_name(name)
            return await generate.generate_sse(llm, state_of(request).renderer, name, version, await read_json(request),
                                               key_id_of(request))
        return await guarded(run)
