"""Worker registration API: /v1/admin/workers.

Protected by the admin key (`--admin-key` / $SLUICE_ADMIN_KEY) as a bearer
token, compared in constant time and never echoed. Without a key, only
loopback clients may call these routes.
"""

from __future__ import annotations

import hmac
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engines.base import EngineError
from gateway.errors import OpenAIError
from gateway.state import state_of
from gateway.workers import WorkerRecord, discover_kv_events

router = APIRouter()

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def authorize(request: Request) -> None:
    key = state_of(request).settings.admin_key
    if key is None:
        host = request.client.host if request.client else ""
        if host not in _LOOPBACK and not host.startswith("127."):
            raise OpenAIError(403, "admin routes accept only loopback clients unless an admin key is set")
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), key.encode()):
        raise OpenAIError(401, "missing or invalid admin key", headers={"WWW-Authenticate": "Bearer"})


def _pool(request: Request) -> Any:
    pool = state_of(request).workers
    if pool is None:
        raise OpenAIError(503, "worker registration is not available", err_type="server_error")
    return pool


@router.post("/v1/admin/workers")
async def register_worker(request: Request) -> JSONResponse:
    authorize(request)
    try:
        body = await request.json()
        record = WorkerRecord.from_dict(body if isinstance(body, dict) else {})
    except ValueError as e:
        raise OpenAIError(400, f"invalid worker record: {e}") from None
    record = await discover_kv_events(record)
    try:
        models = await _pool(request).add(record)
    except EngineError as e:
        raise OpenAIError.from_engine(e) from None
    return JSONResponse({"name": record.name, "models": models}, status_code=201)


@router.delete("/v1/admin/workers/{name}")
async def deregister_worker(name: str, request: Request) -> Response:
    authorize(request)
    if not await _pool(request).remove(name):
        raise OpenAIError(404, f"no worker named {name!r}", code="worker_not_found")
    return Response(status_code=204)


@router.post("/v1/admin/workers/{name}/drain")
async def drain_worker(name: str, request: Request) -> JSONResponse:
    authorize(request)
    pool = _pool(request)
    try:
        pool.router.drain(name, request.query_params.get("undo") is None)
    except KeyError:
        raise OpenAIError(404, f"no worker named {name!r}", code="worker_not_found") from None
    return JSONResponse({"name": name, "draining": request.query_params.get("undo") is None})


@router.get("/v1/admin/workers")
async def list_workers(request: Request) -> JSONResponse:
    authorize(request)
    pool = _pool(request)
    out = []
    for w in pool.router.workers():
        d = asdict(w)
        d["breaker"] = w.breaker.name.lower() if hasattr(w.breaker, "name") else str(w.breaker)
        out.append(d)
    return JSONResponse({"object": "list", "data": out})
