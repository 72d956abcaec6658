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
    """200 once this replica can serve: started, not draining, its in-process engines and repository
    up. A model served by workers counts only with --strict-readiness (it is down on every replica
    alike, and taking them all out of service would take every other model with it); `details.models`
    counts the models that can serve and those that cannot (names are in `sluice_model_ready`)."""
    st = state_of(request)
    if st.drain.draining:
        return JSONResponse({"status": "unavailable", "detail": "draining"}, status_code=503,
                            headers={"Retry-After": "1"})
    ok = st.ready and st.llm.ready(st.settings.strict_readiness) and (st.classic is None or st.classic.ready())
    states = list(st.llm.registry.readiness().values())
    detail: dict[str, object] = {"models": {"ready": sum(states), "unavailable": len(states) - sum(states)}}
    quotas = st.security.quotas.health_detail()  # per-replica quotas are degraded, not unavailable
    if quotas is not None:
        detail["quotas"] = quotas
    details = {"details": detail}
    if ok:
        return JSONResponse({"status": "ok", **details})
    reason = st.startup_error or ("starting" if not st.ready else "a model cannot serve")
    return JSONResponse({"status": "unavailable", "detail": reason, **details}, status_code=503)


@router.get("/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": __version__})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    st = state_of(request)
    body, content_type = await exposition(st.registry, st.peers, request.headers.get("accept", ""))
    return Response(body, headers={"Content-Type": content_type})
