"""Choosing an LLM worker: KV-cache prefix affinity weighed against load.

The gateway uses :class:`Router` (see `router.router` for the call sequence)
and takes the names it offers operators from here: :data:`POLICIES` and
:data:`DEFAULT_POLICY`, :data:`REDIS_URL_SCHEMES` with :func:`validate_redis_url`.
The routing cost is in seconds and learns its own coefficients (`router.cost`,
`router.learning`); their names and priors are in `router.config`. Nothing in this package imports FastAPI,
Starlette or gRPC.
"""

from __future__ import annotations

from router.config import (
    COST_PARAMETERS,
    DEFAULT_POLICY,
    POLICIES,
    REDIS_URL_SCHEMES,
    LearningConfig,
    PolicyName,
    RedisStateConfig,
    RouterConfig,
    TtftModel,
    WorkerInfo,
    validate_redis_url,
)
from router.policies import Candidate
from router.router import Router
from router.telemetry.health import BreakerState
from router.types import NoWorkerError, Ranking, WorkerStatus

__all__ = ["COST_PARAMETERS", "DEFAULT_POLICY", "POLICIES", "REDIS_URL_SCHEMES", "BreakerState", "Candidate",
           "LearningConfig", "NoWorkerError", "PolicyName", "Ranking", "RedisStateConfig", "Router",
           "RouterConfig", "TtftModel", "WorkerInfo", "WorkerStatus", "validate_redis_url"]
