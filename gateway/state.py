"""Per-app state, reachable from a request as `state_of(request)`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from prometheus_client import CollectorRegistry

from gateway.backends import RouteHints
from gateway.llm_service import LLMService
from gateway.metrics import LLMMetrics
from gateway.settings import Settings


@dataclass(slots=True)
class AppState:
    settings: Settings
    registry: CollectorRegistry
    metrics: LLMMetrics
    llm: LLMService
    classic: Any = None  # engines.classic.ModelRepositoryManager, when a repository is served
    embeddings: Any = None  # gateway.openai.embeddings.EmbeddingBridge
    router: Any = None  # router.Router
    workers: Any = None  # gateway.workers.WorkerPool
    started_at: float = field(default_factory=time.time)
    ready: bool = False  # set once every model can serve
    startup_error: str | None = None


def state_of(request: Request) -> AppState:
    return request.app.state.sluice  # type: ignore[no-any-return]


def hints_from(request: Request) -> RouteHints:
    return RouteHints(
        policy=request.headers.get("x-routing-policy"),
        session_key=request.headers.get("x-session-id"),
    )
