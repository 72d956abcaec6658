"""Start-up and shutdown, in one place.

The HTTP server listens first; models load in a background task, so `/health`
answers 503 until every model can serve. A frontend of `--frontends N` loads first
and opens its ports after (gateway.frontends.supervisor). Order: the router's drivers and gRPC,
then the classic repository (it scans `config.pbtxt` once, LLM configs included),
then static workers, discovered workers (Kubernetes EndpointSlices) or in-process
LLMs, then the embeddings bridge, then — in
worker mode — self-registration with a gateway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

from engines import heap
from engines.classic.repository.disk import model_dirs
from engines.errors import SluiceError
from engines.launchers.registration import Keeper, WorkerRecord
from gateway.app_state import AppState
from gateway.discovery import K8sDiscovery, parse_discovery
from gateway.embedding_models import EmbeddingBridge
from gateway.frontends import registrations
from gateway.frontends.channel import Peers
from gateway.frontends.supervisor import frontend_env, local_llms_refused, mark_ready
from gateway.http.metrics_port import MetricsServer
from gateway.llm.local import LLMSpec, specs_from_configs, start_local_llm, stop_local_engines
from gateway.llm.workers.probe import KEY_REFUSED

log = logging.getLogger("sluice.startup")
_STATIC_WORKER_DEADLINE_S = 900.0  # workers listed at start may still be loading their engine


@asynccontextmanager
async def lifespan(state: AppState, llm_specs: list[LLMSpec] | None) -> AsyncIterator[None]:
    """`llm_specs` overrides the LLMs of the repository (worker mode)."""
    _announce_access(state)
    if state.loop_lag is not None:
        state.loop_lag.start()
    await state.security.quotas.start()
    if state.fair_share is not None:
        state.fair_share.start()
    frontend = frontend_env()
    task: asyncio.Task[None] | None = None
    discovery: K8sDiscovery | None = None
    grpc_server: Any = None
    metrics_server: MetricsServer | None = None
    if frontend is None:
        grpc_server = await _start_grpc(state)
        metrics_server = await _start_metrics_server(state)
        await state.router.start()
        discovery = _discovery(state)
        task = asyncio.create_task(bootstrap(state, llm_specs, discovery), name="sluice-bootstrap")
    else:
        discovery, grpc_server, metrics_server = await _start_frontend(state, frontend, llm_specs)
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await _shutdown(state, discovery, grpc_server, metrics_server)


async def _start_frontend(state: AppState, frontend: tuple[int, Path], llm_specs: list[LLMSpec] | None
                          ) -> tuple[K8sDiscovery | None, Any, MetricsServer | None]:
    """One of --frontends N: it opens its ports once ready (uvicorn listens after the lifespan's
    start-up returns), so the kernel sends connections only to frontends that can serve them."""
    discovery: K8sDiscovery | None = None
    grpc_server: Any = None
    metrics_server: MetricsServer | None = None
    try:
        state.peers = Peers(frontend[1], frontend[0], state.settings.frontends, state.registry, state.classic,
                            on_worker=partial(registrations.apply, state))
        await state.peers.start()  # its siblings ask it for metrics and statistics, and tell it registrations
        await state.router.start()
        discovery = _discovery(state)
        state.startup_task = asyncio.create_task(bootstrap(state, llm_specs, discovery), name="sluice-bootstrap")
        await state.startup_task  # a stop signal now cancels it (gateway.http.server)
        if state.startup_error is not None:
            raise RuntimeError(state.startup_error)
        grpc_server = await _start_grpc(state)
        metrics_server = await _start_metrics_server(state)
        mark_ready(frontend)
    except BaseException:
        await _shutdown(state, discovery, grpc_server, metrics_server)
        raise
    return discovery, grpc_server, metrics_server


async def _shutdown(state: AppState, discovery: K8sDiscovery | None, grpc_server: Any,
                    metrics_server: MetricsServer | None) -> None:
    if grpc_server is not None:
        # First, while the workers still answer. After a drain (gateway.http.server) its calls have ended
        # or passed the deadline; the grace is for a stop without one.
        await grpc_server.stop(grace=2)
    if discovery is not None:
        await discovery.stop()
    if state.registration is not None:
        await asyncio.to_thread(state.registration.stop)  # deregisters, if it ever registered
    await state.workers.stop()
    await state.router.stop()
    if state.classic is not None:
        await state.classic.stop()
    await stop_local_engines(state.llm.registry)
    state.renderer.close()
    await state.security.quotas.stop()
    if state.fair_share is not None:
        await state.fair_share.stop()
    await state.attestations.close()
    if metrics_server is not None:
        await metrics_server.stop()
    if state.peers is not None:
        await state.peers.stop()
    await asyncio.to_thread(state.llm.tracing.shutdown)  # flushes buffered spans
    if state.loop_lag is not None:
        await state.loop_lag.stop()
    heap.thaw()  # what shutdown dropped can be collected (an app run inside a larger process)


async def bootstrap(state: AppState, llm_specs: list[LLMSpec] | None,
                    discovery: K8sDiscovery | None = None) -> None:
    """Load every model; `state.ready` turns true only when all are ready (with discovery:
    once every EndpointSlice source has been listed and reconciled, whatever it held)."""
    s = state.settings
    registry = state.llm.registry
    try:
        if state.classic is not None:
            # Until the repository is parsed, any of its names may be an LLM still loading.
            registry.pending.update(model_dirs(state.classic.repo_dir))
            await state.classic.start()
            registry.pending.clear()
        if s.has_static_workers:
            await _add_static_workers(state)  # workers serve the LLMs; none run in-process too
        if state.peers is not None:  # what registered with the other frontends before this one started
            await registrations.restore(state, state.peers.directory)
        if discovery is not None:
            await discovery.start()
            await discovery.synced.wait()
        if llm_specs is None and state.classic is not None and not s.workers_only:
            _refuse_llms_in_frontends(state)
            llm_specs = await asyncio.to_thread(specs_from_configs, state.classic.llm_model_configs(),
                                                state.classic.repo_dir, s.served_llms)
        registry.pending.update(spec.name for spec in llm_specs or [])
        for spec in llm_specs or []:
            await start_local_llm(registry, spec, s.engine_max_batch_size)
        if state.classic is not None:
            state.embeddings = await asyncio.to_thread(EmbeddingBridge.discover, state.classic)
        heap.freeze()  # engines/heap.py: what start-up made leaves the collector's full passes
        state.ready = True
        if s.register_with:
            _register_self(state)
        log.info("ready: %d LLM(s), classic repository %s", len(registry.models),
                 "on" if state.classic is not None else "off")
    except asyncio.CancelledError:
        raise
    except Exception as e:
        registry.pending.clear()
        state.startup_error = f"startup failed: {e}"
        log.exception("startup failed")


def _refuse_llms_in_frontends(state: AppState) -> None:
    s = state.settings
    assert state.classic is not None
    names = [n for n in state.classic.llm_model_configs() if not s.served_llms or n in s.served_llms]
    if s.frontends > 1 and names:
        raise SluiceError(f"--frontends {s.frontends}: {local_llms_refused(names)}")


def _discovery(state: AppState) -> K8sDiscovery | None:
    specs = [parse_discovery(spec) for spec in state.settings.k8s_discovery]
    if specs and not any("workers" in p.scopes for p in state.security.admin.principals()):
        raise SluiceError("--k8s-discovery admits only workers that register with the registration key: set "
                          "SLUICE_REGISTRATION_KEY or --registration-key-file (the key worker pods hold)")
    if specs and state.settings.redis_url and not state.settings.attestation_key:
        log.warning("--k8s-discovery without SLUICE_ATTESTATION_KEY: registrations are not shared through Redis, "
                    "so only the gateway replica a worker registered with routes to it")
    return K8sDiscovery(specs, state.workers, state.attestations) if specs else None


async def _start_grpc(state: AppState) -> Any:
    s = state.settings
    if state.classic is None or not s.grpc_port:
        return None
    from gateway.kserve.grpc.limits import GrpcLimits
    from gateway.kserve.grpc.server import start_grpc_server

    return await start_grpc_server(state.classic, state.llm, s.host, s.grpc_port, GrpcLimits.from_settings(s),
                                   state.security, state.peers, state.renderer, drain=state.drain)


async def _start_metrics_server(state: AppState) -> MetricsServer | None:
    s = state.settings
    if s.metrics_port is None:
        return None
    server = MetricsServer(state.registry, state.security, s.host, s.metrics_port, state.peers)
    await server.start()
    return server


def _announce_access(state: AppState) -> None:
    s, sec = state.settings, state.security
    ports = f"HTTP port {s.http_port}" + (f" and gRPC port {s.grpc_port}" if s.grpc_port else "")
    if not len(sec.api):
        log.warning("NO API KEYS CONFIGURED: inference is open to anyone who can reach %s. Set SLUICE_API_KEYS "
                    "or --api-keys-file.", ports)
    else:
        log.info("API keys: %d (%s)", len(sec.api), ", ".join(p.id for p in sec.api.principals()))
    if not len(sec.admin):
        log.info("no admin key configured: admin routes answer only direct loopback clients")
    if s.redis_url:
        log.info("quotas are shared through Redis")
    elif s.frontends > 1 and sec.quotas.limited:
        log.info("quotas are shared by the %d frontends (gateway.security.node_quotas)", s.frontends)


async def _add_static_workers(state: AppState) -> None:
    """Register --worker / --workers-file entries, waiting for workers that are still starting."""
    s = state.settings
    records = s.static_worker_records()
    loop = asyncio.get_running_loop()
    end = loop.time() + _STATIC_WORKER_DEADLINE_S
    for record in records:
        while True:
            try:
                await state.workers.add(record)
                break
            except SluiceError as e:
                if loop.time() > end or e.code == KEY_REFUSED:  # a refused key will not start to work
                    raise
                log.info("waiting for worker %s: %s", record.name, e.message)
                await asyncio.sleep(1.0)


def _register_self(state: AppState) -> None:
    """Worker mode: announce this server's models to a gateway, retried with back-off beside the
    serving engine (a gateway that is down or refuses never takes the worker out of service)."""
    s = state.settings
    assert s.register_with is not None
    host = "127.0.0.1" if s.host in ("0.0.0.0", "::") else s.host
    record = WorkerRecord(name=s.worker_name or f"transformers-{s.http_port}",
                          url=s.advertise_url or f"http://{host}:{s.http_port}",
                          models=tuple(state.llm.registry.names()), engine="transformers",
                          # its in-process engine's batch size (the smallest, if it serves several)
                          capacity=min((m.admission.capacity for m in state.llm.registry.models.values()),
                                       default=None))
    state.registration = Keeper(s.register_with, record, s.registration_key).start()
