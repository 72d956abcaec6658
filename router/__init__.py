"""Choosing an LLM worker: KV-cache prefix affinity weighed against load.

The gateway uses :class:`Router` (see `router.router` for the call sequence).
Nothing in this package imports FastAPI, Starlette or gRPC.
"""

from __future__ import annotations

from router.config import CostWeights, RouterConfig, WorkerInfo
from router.health import BreakerState
from router.policies import Candidate
from router.router import Router
from router.types import NoWorkerError, Ranking, WorkerStatus

__all__ = ["BreakerState", "Candidate", "CostWeights", "NoWorkerError", "Ranking", "Router",
           "RouterConfig", "WorkerInfo", "WorkerStatus"]
