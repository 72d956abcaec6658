"""Worker registration API: /v1/admin/workers.

Admin routes: the access middleware (`gateway.security.http`) authenticates a key
holding the `workers` scope (an admin key, or the registration key workers hold)
before the body is read, or, with no admin key configured, admits only a direct
loopback peer that is not a browser page. A registration also vouches for the
worker's name and URL to Kubernetes discovery (`gateway.discovery.attest`).
`require_admin` fails closed if a route here were ever not classified as admin by
the access table. A registration key (no `repository` scope) registers, deregisters
or drains only a worker at its own address (`gateway.security.registrant`).
"""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from engines.errors import ErrorKind, SluiceError
from engines.launchers.registration import WorkerRecord
from gateway.app_state import state_of
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


def _one_process_only(request: Request) -> None:
    """With --frontends N a change would reach the one frontend this connection landed on."""
    st = state_of(request)
    if st.peers is not None:
        raise SluiceError(f"--frontends {st.settings.frontends}: registering, removing or draining a worker here "
                          "would change one frontend only; list workers with --worker, --workers-file or "
                          "--k8s-discovery", ErrorKind.UNSUPPORTED, code="frontends_unsupported")


@router.post("/v1/admin/workers")
async def register_worker(record: WorkerRecord, request: Request) -> JSONResponse:
    _one_process_only(request)
    # Not checked: the address of a same-named worker this replaces (a pod restarted with a new IP
    # re-registers under its stable name, and a crashed one never deregistered).
    await require_own_address(request, record.url, "register")
    models = await state_of(request).workers.add(record)
    # The key held the `workers` scope (the access table): discovery may now admit this name and URL.
    await state_of(request).attestations.vouch(record.name, record.url)
    return JSONResponse({"name": record.name, "models": models}, status_code=201)


@router.delete("/v1/admin/workers/{name}")
async def deregister_worker(name: str, request: Request) -> Response:
    _one_process_only(request)
    await _owned(request, name, "deregister")
    await state_of(request).attestations.revoke(name)
    if not await state_of(request).workers.remove(name):
        raise _not_found(name)
    return Response(status_code=204)


@router.post("/v1/admin/workers/{name}/drain")
async def drain_worker(name: str, request: Request) -> JSONResponse:
    _one_process_only(request)
    draining = request.query_params.get("undo") is None
    await _owned(request, name, "drain")
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
