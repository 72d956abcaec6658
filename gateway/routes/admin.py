"""Worker registration API: /v1/admin/workers.

Admin routes: the access middleware (`gateway.security.http`) authenticates a key
holding the `workers` scope (an admin key, or the registration key workers hold)
before the body is read, or, with no admin key configured, admits only a direct
loopback peer that is not a browser page. A registration also vouches for the
worker's name and URL to Kubernetes discovery (`gateway.discovery.attest`).
`require_admin` fails closed if a route here were ever not classified as admin by
the access table. A registration key (no `repository` scope) registers, deregisters
or drains only a worker at its own address (`gateway.security.registrant`). With `--frontends N`
a change reaches every frontend before the route answers (`gateway.frontends.registrations`).
"""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from engines.errors import ErrorKind, SluiceError
from engines.launchers.registration import WorkerRecord
from gateway.app_state import state_of
from gateway.frontends.registrations import broadcast
from gateway.security.access import require_admin
from gateway.security.registrant import confined, require_own_address

router = APIRouter(dependencies=[Depends(require_admin)])


def _not_found(name: str) -> SluiceError:
    return SluiceError(f"no worker named {name!r}", ErrorKind.NOT_FOUND, code="worker_not_found")


async def _owned(request: Request, name: str, action: str) -> None:
    """For a registration key: 404 for an unknown worker, 403 unless it is at the caller's address."""
    if not confined(request):
        return
    url = next((w.url for w in state_of(request).router.workers() if w.name == name), None)
    if url is None:
        raise _not_found(name)
    await require_own_address(request, url, action)


@router.post("/v1/admin/workers")
async def register_worker(record: WorkerRecord, request: Request) -> JSONResponse:
    # Not checked: the address of a same-named worker this replaces (a pod restarted with a new IP
    # re-registers under its stable name, and a crashed one never deregistered).
    await require_own_address(request, record.url, "register")
    models = await state_of(request).workers.add(record)
    # The key held the `workers` scope (the access table): discovery may now admit this name and URL.
    await state_of(request).attestations.vouch(record.name, record.url)
    await broadcast(state_of(request), {"action": "add", "record": record.model_dump(mode="json")})
    return JSONResponse({"name": record.name, "models": models}, status_code=201)


@router.delete("/v1/admin/workers/{name}")
async def deregister_worker(name: str, request: Request) -> Response:
    await _owned(request, name, "deregister")
    await state_of(request).attestations.revoke(name)
    removed = await state_of(request).workers.remove(name)
    await broadcast(state_of(request), {"action": "remove", "name": name})
    if not removed:
        raise _not_found(name)
    return Response(status_code=204)


@router.post("/v1/admin/workers/{name}/drain")
async def drain_worker(name: str, request: Request) -> JSONResponse:
    draining = request.query_params.get("undo") is None
    await _owned(request, name, "drain")
    try:
        state_of(request).router.drain(name, draining)
    except KeyError:
        raise _not_found(name) from None
    await broadcast(state_of(request), {"action": "drain", "name": name, "draining": draining})
    return JSONResponse({"name": name, "draining": draining})


@router.get("/v1/admin/workers")
async def list_workers(request: Request) -> JSONResponse:
    out = []
    for w in state_of(request).router.workers():
        d = asdict(w)
        d["breaker"] = w.breaker.name.lower() if hasattr(w.breaker, "name") else str(w.breaker)
        out.append(d)
    return JSONResponse({"object": "list", "data": out})
