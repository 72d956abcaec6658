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
    state = AppState(settings=settings, registry=registry, metrics=metrics, llm=llm)
    _attach_router(state)
    return state


def _attach_router(state: AppState) -> None:
    """The router and worker pool exist in every gateway, so workers can register at any time."""
    from router import Router, RouterConfig

    from gateway.workers import WorkerPool

    s = state.settings
    config = s.router_config or RouterConfig(policy=s.routing_policy)
    shared = None
    if s.redis_url:
        from router.redis_state import RedisSharedState, RedisStateConfig

        shared = RedisSharedState(RedisStateConfig(url=s.redis_url))
    state.router = Router(config, state.registry, shared)
    state.workers = WorkerPool(state.llm, state.router, s.model_repository)


def create_app(settings: Settings, llm_specs: list[LLMSpec] | None = None) -> FastAPI:
    """`llm_specs` overrides the LLMs found in the repository (worker mode)."""
    state = build_state(settings)
    _attach_classic(state)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        grpc_server = await _start_grpc(state)
        await state.router.start()
        task = asyncio.create_task(_bootstrap(state, llm_specs), name="sluice-bootstrap")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if state.settings.register_with and state.ready:
                from engines.launchers.registration import deregister

                await asyncio.to_thread(deregister, state.settings.register_with, state.settings.worker_name or "")
            await state.workers.stop()
            await state.router.stop()
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

    from gateway import admin
    from gateway.openai import chat, completions, embeddings, misc, models

    for module in (chat, completions, embeddings, models, misc, admin):
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


async def _add_static_workers(state: AppState, deadline_s: float = 900.0) -> None:
    """Register --worker / --workers-file entries, waiting for workers that are still starting."""
    import yaml

    from gateway.workers import WorkerRecord, discover_kv_events, parse_worker_arg

    s = state.settings
    records = [parse_worker_arg(w, i) for i, w in enumerate(s.workers)]
    if s.workers_file is not None:
        data = yaml.safe_load(s.workers_file.read_text()) or []
        items = data.get("workers", []) if isinstance(data, dict) else data
        records += [WorkerRecord.from_dict(item) for item in items]
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    for record in records:
        while True:
            try:
                await state.workers.add(await discover_kv_events(record))
                break
            except EngineError as e:
                if loop.time() > end:
                    raise
                log.info("waiting for worker %s: %s", record.name, e.message)
                await asyncio.sleep(1.0)


async def _register_self(state: AppState) -> None:
    """Worker mode: announce this server's models to a gateway."""
    from engines.launchers.registration import register, worker_record

    s = state.settings
    url = s.advertise_url or f"http://{'127.0.0.1' if s.host in ('0.0.0.0', '::') else s.host}:{s.http_port}"
    record = worker_record(name=s.worker_name or f"transformers-{s.http_port}", url=url,
                           models=state.llm.model_names(), engine="transformers", block_size=None,
                           kv_events_endpoint=None, kv_events_replay_endpoint=None)
    await asyncio.to_thread(register, s.register_with, record)


async def _bootstrap(state: AppState, llm_specs: list[LLMSpec] | None) -> None:
    """Load every model; /health turns 200 only when all are ready."""
    s = state.settings
    try:
        if s.has_static_workers:
            # Workers serve the LLMs; the gateway does not load them in-process too.
            await _add_static_workers(state)
            llm_specs = llm_specs or []
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
        if s.register_with:
            await _register_self(state)
        log.info("ready: %d LLM(s), classic repository %s", len(state.llm.models),
                 "on" if state.classic is not None else "off")
    except asyncio.CancelledError:
        raise
    except Exception as e:
        state.startup_error = f"startup failed: {e}"
        log.exception("startup failed")
