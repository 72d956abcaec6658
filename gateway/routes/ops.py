"""Operations routes: /health, /version, /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway import __version__
from gateway.app_state import state_of
from gateway.frontends.channel import exposition

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    """200 once every model can serve; 503 with a reason while starting or degraded."""
    st = state_of(request)
    if st.drain.draining:
        return JSONResponse({"status": "unavailable", "detail": "draining"}, status_code=503,
                            headers={"Retry-After": "1"})
    ok = st.ready and st.llm.ready() and (st.classic is None or st.classic.ready())
    quotas = st.security.quotas.health_detail()  # per-replica quotas are degraded, not unavailable
    details = {"details": {"quotas": quotas}} if quotas is not None else {}
    if ok:
        return JSONResponse({"status": "ok", **details})
    detail = st.startup_error or ("starting" if not st.ready else "a model cannot serve")
    return JSONResponse({"status": "unavailable", "detail": detail, **details}, status_code=503)


@router.get("/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": __version__})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    st = state_of(request)
    body, content_type = await exposition(st.registry, st.peers, request.headers.get("accept", ""))
    return Response(body, headers={"Content-Type": content_type})
