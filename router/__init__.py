"""Choosing an LLM worker: KV-cache prefix affinity weighed against load.

The gateway uses :class:`Router` (see `router.router` for the call sequence)
and takes the names it offers operators from here: :data:`POLICIES` and
:data:`DEFAULT_POLICY`, :data:`COST_WEIGHT_NAMES`, :data:`REDIS_URL_SCHEMES`
with :func:`validate_redis_url`. Nothing in this package imports FastAPI,
Starlette or gRPC.
"""

from __future__ import annotations

from router.config import (
    COST_WEIGHT_NAMES,
    DEFAULT_POLICY,
    POLICIES,
    REDIS_URL_SCHEMES,
    CostWeights,
    PolicyName,
    RedisStateConfig,
    RouterConfig,
    WorkerInfo,
    validate_redis_url,
)
from router.health import BreakerState
from router.policies import Candidate
from router.router import Router
from router.types import NoWorkerError, Ranking, WorkerStatus

__all__ = ["COST_WEIGHT_NAMES", "DEFAULT_POLICY", "POLICIES", "REDIS_URL_SCHEMES", "BreakerState", "Candidate",
           "CostWeights", "NoWorkerError", "PolicyName", "Ranking", "RedisStateConfig", "Router", "RouterConfig",
           "WorkerInfo", "WorkerStatus", "validate_redis_url"]
