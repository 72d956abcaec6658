"""The ASGI application: routes, error handlers, middleware and the model lifecycle."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from engines.base import EngineError
from gateway import __version__
from gateway.admission import AdmissionConfig
from gateway.bootstrap import LLMSpec, llm_specs_from_repository, start_local_llm, stop_engines
from gateway.errors import (
    OpenAIError,
    engine_error_handler,
    http_error_handler,
    openai_error_handler,
    validation_error_handler,
)
from gateway.llm_service import LLMService
from gateway.metrics import EngineStatsCollector, LLMMetrics
from gateway.middleware import SluiceMiddleware
from gateway.settings import Settings
from gateway.state import AppState

log = logging.getLogger("sluice.app")


def build_state(settings: Settings) -> AppState:
    registry = CollectorRegistry()
    metrics = LLMMetrics(registry)
    llm = LLMService(metrics, AdmissionConfig(settings.max_running, settings.max_queued))
    registry.register(EngineStatsCollector(llm.engine_stats))
    return AppState(settings=settings, registry=registry, metrics=metrics, llm=llm)


def create_app(settings: Settings, llm_specs: list[LLMSpec] | None = None) -> FastAPI:
    """`llm_specs` overrides the LLMs found in the repository (worker mode)."""
    state = build_state(settings)
    _attach_classic(state)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        grpc_server = await _start_grpc(state)
        task = asyncio.create_task(_bootstrap(state, llm_specs), name="sluice-bootstrap")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if grpc_server is not None:
                await grpc_server.stop(grace=2)
            if state.classic is not None:
                await state.classic.stop()
            await stop_engines(state)

    app = FastAPI(title="Sluice", version=__version__, lifespan=lifespan)
    app.state.sluice = state
    app.add_exception_handler(OpenAIError, openai_error_handler)
    app.add_exception_handler(EngineError, engine_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    def observe(route: str, model: str, status: int) -> None:
        # Only known model names become label values: clients choose the rest.
        known = state.llm.has_model(model) or (state.embeddings is not None and model in state.embeddings.models)
        state.metrics.requests.labels(route, model if known else "", str(status)).inc()

    app.add_middleware(SluiceMiddleware, max_body_bytes=settings.max_body_bytes, observe=observe)

    from gateway.openai import chat, completions, embeddings, misc, models

    for module in (chat, completions, embeddings, models, misc):
        app.include_router(module.router)
    _include_kserve(app, state)
    return app


def _attach_classic(state: AppState) -> None:
    repo = state.settings.model_repository
    if repo is None:
        return
    try:
        from engines.classic import ModelRepositoryManager
    except ImportError:
        log.warning("classic model path unavailable (engines.classic missing)")
        return
    state.classic = ModelRepositoryManager(repo, control_mode=state.settings.model_control_mode,
                                           startup_models=list(state.settings.load_models))
    try:
        from gateway.kserve import metrics as kserve_metrics

        kserve_metrics.register(state.registry, state.classic)
    except ImportError:
        pass


def _include_kserve(app: FastAPI, state: AppState) -> None:
    if state.classic is None:
        return
    try:
        from gateway.kserve.http import build_router
    except ImportError:
        return
    app.include_router(build_router(state.classic, state.llm))


async def _start_grpc(state: AppState) -> Any:
    s = state.settings
    if state.classic is None or not s.grpc_port:
        return None
    try:
        from gateway.kserve.grpc import start_grpc_server
    except ImportError:
        return None
    return await start_grpc_server(state.classic, state.llm, s.host, s.grpc_port)


async def _bootstrap(state: AppState, llm_specs: list[LLMSpec] | None) -> None:
    """Load every model; /health turns 200 only when all are ready."""
    s = state.settings
    try:
        if llm_specs is None and s.model_repository is not None:
            llm_specs = await asyncio.to_thread(llm_specs_from_repository, s.model_repository, s.served_llms)
        for spec in llm_specs or []:
            state.llm.pending.add(spec.name)
        for spec in llm_specs or []:
            await start_local_llm(state, spec)
        if state.classic is not None:
            await state.classic.start()
            from gateway.openai.embeddings import EmbeddingBridge

            state.embeddings = await asyncio.to_thread(EmbeddingBridge.discover, state.classic,
                                                       s.model_repository)
        state.ready = True
        log.info("ready: %d LLM(s), classic repository %s", len(state.llm.models),
                 "on" if state.classic is not None else "off")
    except asyncio.CancelledError:
        raise
    except Exception as e:
        state.startup_error = f"startup failed: {e}"
        log.exception("startup failed")
