"""The app factory: state, routes, error handlers and middleware. Start-up lives in `gateway.http.startup`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from prometheus_client import CollectorRegistry

from engines.classic.manager import ModelRepositoryManager
from gateway import __version__
from gateway.anthropic import messages
from gateway.app_state import AppState
from gateway.cpu_pool import Renderer
from gateway.discovery.attest import Attestations
from gateway.frontends.supervisor import frontend_env, frontend_started
from gateway.http import error_handlers as errors
from gateway.http import startup
from gateway.http.budgets import inflight_limit
from gateway.http.middleware import BodyLimitMiddleware, DrainMiddleware, SluiceMiddleware
from gateway.kserve import metrics as kserve_metrics
from gateway.kserve.http_routes import build_router as kserve_router
from gateway.kserve.infer_http import KServeInferRoute
from gateway.llm.admission import claims_of
from gateway.llm.admission.observe import AdmissionMetrics
from gateway.llm.admission.shared import SharedCounters
from gateway.llm.local import LLMSpec
from gateway.llm.metrics import EngineStatsCollector, LLMMetrics, ModelReadyCollector, RelayEventsCollector
from gateway.llm.service import LLMService
from gateway.llm.tracing import Tracing
from gateway.llm.workers.pool import WorkerPool
from gateway.openai import chat, completions, embeddings, models
from gateway.openai.responses import routes as responses
from gateway.response_store import ResponseStore
from gateway.routes import admin, openapi, ops, ui
from gateway.security.guard import Security, build_security
from gateway.security.http import AccessMiddleware
from gateway.security.tenancy import CacheNamespaces
from gateway.settings import Settings
from gateway.telemetry.runtime import TASK, LoopLag, register_runtime_collectors
from router import Router
from router.replicas.node_state import NodeSharedState, NodeStateConfig
from router.shared import SharedState

# Response headers a browser client may read across origins.
_EXPOSED_HEADERS = ["X-Request-Id", "X-Sluice-Worker", "X-Sluice-Predicted-Cached-Tokens", "X-Sluice-Route-Reason",
                    "X-Sluice-Frontend", "X-Sluice-Predicted-TTFT-Ms", "Retry-After"]


def _llm_service(settings: Settings, registry: CollectorRegistry, metrics: LLMMetrics, security: Security
                 ) -> LLMService:
    llm = LLMService(metrics, settings.admission(), settings.max_fanout, tokens=security.quotas,
                     tracing=Tracing(settings.otlp_endpoint, __version__),
                     salt_for=CacheNamespaces.of(security.api.principals()).salt,
                     claim_for=claims_of((p.id, p.tenant or p.id, p.entitlement) for p in security.api.principals()),
                     migration=settings.migration())
    llm.registry.observer_for = AdmissionMetrics(registry).observer
    registry.register(EngineStatsCollector(llm.engine_stats))
    registry.register(ModelReadyCollector(llm.registry.readiness))
    llm.registry.created = frontend_started()
    return llm


def build_state(settings: Settings) -> AppState:
    registry = CollectorRegistry()
    register_runtime_collectors(registry)
    metrics = LLMMetrics(registry)
    security = build_security(settings, registry)
    llm = _llm_service(settings, registry, metrics, security)
    shared: SharedState | None = None
    frontend = frontend_env()
    if settings.redis_url:
        from router.replicas.redis_state import RedisSharedState, RedisStateConfig

        options = settings.redis_options()
        shared = RedisSharedState(RedisStateConfig(url=settings.redis_url, password=options.get("password"),
                                                   ssl_ca_certs=options.get("ssl_ca_certs")))
    elif frontend is not None:  # the sibling frontends share one routing picture (router.replicas.node_state)
        shared = NodeSharedState(NodeStateConfig(frontend[1], frontend[0], settings.frontends))
    # The router and worker pool exist in every gateway, so workers can register at any time.
    router = Router(settings.router_config(), registry, shared)
    # Every request in flight may wait for a render once: a burst is bounded by the render timeout, not refused.
    inflight = inflight_limit(settings.max_inflight_requests, settings.frontends)
    renderer = Renderer(settings.template_timeout_s, settings.template_threads, settings.allow_client_chat_templates,
                        max_waiting=max(256, inflight), max_prompt_chars=settings.prompt_char_limit(),
                        bulk_threads=settings.bulk_threads)
    state = AppState(settings=settings, registry=registry, metrics=metrics, llm=llm, router=router,
                     workers=WorkerPool(llm.registry, router, settings.model_repository,
                                        stall_timeout_s=settings.worker_stall_timeout_s,
                                        read_interval_s=settings.relay_interval_ms / 1000,
                                        worker_key=settings.resolved_worker_key(),
                                        frontend=(frontend[0], settings.frontends) if frontend else (0, 1)),
                     renderer=renderer, security=security,
                     attestations=Attestations(settings.redis_url, settings.redis_options(),
                                               mac_key=settings.attestation_key))
    state.responses = ResponseStore(settings.responses_store_max, settings.responses_store_max_bytes,
                                    settings.responses_store_ttl_s, redis=_redis(settings))
    if settings.redis_url:
        models = llm.registry.models
        state.fair_share = SharedCounters(_redis(settings), lambda: {n: m.admission.queue for n, m in models.items()})
    if settings.model_repository is not None:
        state.classic = ModelRepositoryManager(settings.model_repository, control_mode=settings.model_control_mode,
                                               startup_models=list(settings.load_models),
                                               limits=settings.classic_limits(),
                                               allow_uploads=settings.allow_model_uploads)
        kserve_metrics.register(registry, state.classic)
    registry.register(RelayEventsCollector(state.workers.relay_counts))
    state.loop_lag = LoopLag(registry, on_restart=router.metrics.task_restarts.labels(TASK, "").inc)
    return state


def _redis(settings: Settings) -> Any:
    """A Redis client for the gateway's own records (stored responses), or None without --redis-url."""
    if not settings.redis_url:
        return None
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    options: dict[str, Any] = dict(settings.redis_options())
    return aioredis.Redis.from_url(settings.redis_url, socket_timeout=1.0, socket_connect_timeout=1.0,
                                   retry=Retry(NoBackoff(), 1), **options)


def create_app(settings: Settings, llm_specs: list[LLMSpec] | None = None) -> FastAPI:
    """`llm_specs` overrides the LLMs found in the repository (worker mode)."""
    state = build_state(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with startup.lifespan(state, llm_specs):
            yield

    # FastAPI's own OpenTelemetry hooks stay off: each request would ask OpenTelemetry for its
    # three global providers, and an installed SDK would get HTTP spans nobody asked for.
    # Sluice's traces are its own (gateway/llm/tracing.py, --otlp-endpoint).
    app = FastAPI(title="Sluice", version=__version__, lifespan=lifespan,
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.sluice = state
    errors.install(app)

    def observe(route: str, model: str, status: int) -> None:
        # Only known model names become label values: clients choose the rest.
        known = state.llm.registry.has(model) or (state.embeddings is not None and model in state.embeddings.models)
        state.metrics.requests.labels(route, model if known else "", str(status)).inc()

    # Added innermost first. From the outside in: request id, in-flight bound, 500s and the
    # access log; the drain gate (refusals while draining get request ids and are logged);
    # CORS (a preflight needs no key); access control; then the body limits, so a stranger
    # cannot make the server read or inflate a body; then KServe infer, which answers its own
    # route without FastAPI's router.
    if state.classic is not None:  # innermost: after every check below, before FastAPI's router
        app.add_middleware(KServeInferRoute, manager=state.classic, llms=state.llm.registry, pool=state.renderer)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes,
                       body_timeout_s=settings.body_timeout_s, pool=state.renderer)
    app.add_middleware(AccessMiddleware, security=state.security, render=errors.error_bytes)
    if state.security.cors_allow_origins:
        app.add_middleware(CORSMiddleware, allow_origins=state.security.cors_allow_origins, allow_methods=["*"],
                           allow_headers=["*"], expose_headers=_EXPOSED_HEADERS)
    app.add_middleware(DrainMiddleware, drain=state.drain)
    frontend = frontend_env()
    app.add_middleware(SluiceMiddleware, observe=observe,
                       max_inflight=inflight_limit(settings.max_inflight_requests, settings.frontends),
                       frontend=frontend[0] if frontend is not None else None)
    for module in (chat, completions, embeddings, models, responses, messages, ops, admin, ui):
        app.include_router(module.router)
    if state.classic is not None:
        app.include_router(kserve_router(state.classic, state.llm))
    openapi.install(app)
    return app
