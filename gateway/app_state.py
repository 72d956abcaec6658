"""Per-app state, reachable from a request as `state_of(request)`."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request
from prometheus_client import CollectorRegistry

from gateway.cpu_pool import Renderer
from gateway.discovery.attest import Attestations
from gateway.drain import Drain
from gateway.llm.admission import DEADLINE_HEADER, PRIORITY_HEADER, Asks
from gateway.llm.metrics import LLMMetrics
from gateway.llm.service import LLMService
from gateway.llm.targets import RouteHints
from gateway.llm.workers.pool import WorkerPool
from gateway.response_store import ResponseStore
from gateway.security.guard import Security
from gateway.settings import Settings
from router import Router

if TYPE_CHECKING:
    from engines.classic.manager import ModelRepositoryManager
    from engines.launchers.registration import Keeper
    from gateway.embedding_models import EmbeddingBridge
    from gateway.frontends.channel import Peers
    from gateway.llm.admission.shared import SharedCounters
    from gateway.telemetry.runtime import LoopLag


@dataclass(slots=True)
class AppState:
    settings: Settings
    registry: CollectorRegistry
    metrics: LLMMetrics
    llm: LLMService
    router: Router
    workers: WorkerPool
    renderer: Renderer
    security: Security  # keys, quotas and their metrics
    classic: ModelRepositoryManager | None = None  # when a repository is served
    embeddings: EmbeddingBridge | None = None
    started_at: float = field(default_factory=time.time)
    ready: bool = False  # set once every model can serve
    startup_error: str | None = None
    drain: Drain = field(default_factory=Drain)  # in-flight requests; draining after SIGTERM
    peers: Peers | None = None  # the sibling frontends of `--frontends N`
    startup_task: asyncio.Task[None] | None = None  # a frontend's start-up, which it awaits before listening
    # (name, URL) pairs workers registered with a `workers`-scope key: what discovery may admit.
    attestations: Attestations = field(default_factory=Attestations)
    registration: Keeper | None = None  # worker mode (--register-with): keeps this server registered
    loop_lag: LoopLag | None = None  # the event loop's lag, sampled while the app runs
    fair_share: SharedCounters | None = None  # with --redis-url: fair-queuing counters shared by replicas
    responses: ResponseStore = field(default_factory=ResponseStore)  # stored Responses API responses


def state_of(request: Request) -> AppState:
    return request.app.state.sluice  # type: ignore[no-any-return]


_MAX_SESSION_KEY = 256


def session_key_of(headers: Mapping[str, str], names: Sequence[str]) -> str | None:
    """The first of `names` the request carries; a value longer than 256 characters is replaced by its
    SHA-256 (a client's value is hashed per worker by the session policy: its cost stays bounded)."""
    for name in names:
        value = headers.get(name)
        if value:
            return value if len(value) <= _MAX_SESSION_KEY else hashlib.sha256(value.encode()).hexdigest()
    return None


def asks_from(request: Request) -> Asks:
    """What the request asks of the admission scheduler (gateway.llm.admission.policy), as sent."""
    return Asks(request.headers.get(PRIORITY_HEADER), request.headers.get(DEADLINE_HEADER))


def hints_from(request: Request) -> RouteHints:
    st = state_of(request)
    names = (st.router.config.session_header, *st.settings.session_headers)
    return RouteHints(policy=request.headers.get("x-routing-policy"),
                      session_key=session_key_of(request.headers, names))
