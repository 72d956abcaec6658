"""Worker registration API: /v1/admin/workers.

Protected by the admin key ($SLUICE_ADMIN_KEY) as a bearer token, compared in
constant time and never echoed. Without a key, only loopback clients may call
these routes.
"""

from __future__ import annotations

import hmac
from dataclasses import asdict

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from engines.errors import ErrorKind, SluiceError
from engines.launchers.registration import WorkerRecord
from gateway.llm.workers import discover_kv_events
from gateway.state import state_of

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def authorize(request: Request) -> None:
    key = state_of(request).settings.admin_key
    if key is None:
        host = request.client.host if request.client else ""
        if host not in _LOOPBACK and not host.startswith("127."):
            raise SluiceError("admin routes accept only loopback clients unless an admin key is set",
                              ErrorKind.PERMISSION_DENIED)
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), key.encode()):
        raise SluiceError("missing or invalid admin key", ErrorKind.UNAUTHENTICATED)


# Authorised before the body is read: a stranger learns nothing from validation errors.
router = APIRouter(dependencies=[Depends(authorize)])


def _not_found(name: str) -> SluiceError:
    return SluiceError(f"no worker named {name!r}", ErrorKind.NOT_FOUND, code="worker_not_found")


@router.post("/v1/admin/workers")
async def register_worker(record: WorkerRecord, request: Request) -> JSONResponse:
    record = await discover_kv_events(record)
    models = await state_of(request).workers.add(record)
    return JSONResponse({"name": record.name, "models": models}, status_code=201)


@router.delete("/v1/admin/workers/{name}")
async def deregister_worker(name: str, request: Request) -> Response:
    if not await state_of(request).workers.remove(name):
        raise _not_found(name)
    return Response(status_code=204)


@router.post("/v1/admin/workers/{name}/drain")
async def drain_worker(name: str, request: Request) -> JSONResponse:
    draining = request.query_params.get("undo") is None
    try:
        state_of(request).router.drain(name, draining)
    except KeyError:
        raise _not_found(name) from None
    return JSONResponse({"name": name, "draining": draining})


@router.get("/v1/admin/workers")
async def list_workers(request: Request) -> JSONResponse:
    out = []
    for w in state_of(request).router.workers():
        d = asdict(w)
        d["breaker"] = w.breaker.name.lower() if hasattr(w.breaker, "name") else str(w.breaker)
        out.append(d)
    return JSONResponse({"object": "list", "data": out})
