"""One loaded model version: its config, instances + scheduler (or ensemble runner), and stats."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np

from engines import heap
from engines.classic.errors import InferError
from engines.classic.execution.backends import Backend, create_instance
from engines.classic.execution.instances import InstancePool
from engines.classic.execution.rate_limiter import RateLimiter, requirements
from engines.classic.limits import ClassicLimits, execute_timeout_s, isolation
from engines.classic.proto import ModelConfig
from engines.classic.request import InferRequest, RequestSpec
from engines.classic.scheduling.ensemble import EnsembleRunner
from engines.classic.scheduling.scheduler import Scheduler
from engines.classic.stats import BACKEND, CANCELED, OTHER, REJECTED, ModelStats
from engines.errors import ErrorKind

_loads = itertools.count()


def instance_count(config: ModelConfig) -> int:
    """Sum of instance_group counts; a group with count 0 (unset) means 1, as in Triton."""
    if not config.instance_group:
        return 1
    return sum(max(1, g.count) for g in config.instance_group)


class ModelVersion:
    def __init__(self, config: ModelConfig, version: str, scheduler: Scheduler | None,
                 ensemble: EnsembleRunner | None, stats: ModelStats, limits: ClassicLimits) -> None:
        self.config = config
        self.version = version
        self.stats = stats
        self._limits = limits
        self._spec = RequestSpec(config)
        self._scheduler = scheduler
        self._ensemble = ensemble

    @classmethod
    async def load(cls, config: ModelConfig, version_dir: Path, host: Any, limits: ClassicLimits) -> ModelVersion:
        """Create instances, each on its own thread (loading can be slow), and start the scheduler.

        Raises ConfigError when a model file is missing or does not match the config.
        """
        stats = ModelStats(config.name, version_dir.name)
        if config.backend == "ensemble":
            return cls(config, version_dir.name, None, EnsembleRunner(config, host), stats, limits)
        source = str(version_dir.parent / "config.pbtxt")
        limit_s = execute_timeout_s(config, limits, source)
        isolated = isolation(config, source, limits.python_model_user) == "process"

        def factory(index: int) -> Backend:
            return create_instance(config, version_dir, index, host, limit_s if isolated else None,
                                   limits.python_model_user)

        limiter: RateLimiter | None = getattr(host, "rate_limiter", None)
        needs = requirements(config, source)
        key = (config.name, version_dir.name, next(_loads))  # a reload is another entry in the limiter's books
        if limiter is not None and any(needs):
            limiter.register(key, [n for n in needs if n is not None], source)
        pool = InstancePool(config.name, factory, limit_s, on_change=lambda: None)
        try:
            await pool.start(instance_count(config))
        except BaseException:
            if limiter is not None:
                limiter.unregister(key)
            raise
        scheduler = Scheduler(config, pool, stats, limits.max_queue_size,
                              limiter if any(needs) else None, needs, key)
        scheduler.start()
        return cls(config, version_dir.name, scheduler, None, stats, limits)

    @property
    def scheduler(self) -> Scheduler | None:
        return self._scheduler

    async def infer(self, request: InferRequest) -> dict[str, np.ndarray]:
        try:
            self._spec.validate(request, self._limits.max_tensor_elements)
        except InferError:
            self.stats.request_started()
            self.stats.request_done(False, 0)
            raise
        if self._scheduler is not None:
            return await self._scheduler.submit(request)
        return await self._run_ensemble(request)

    async def _run_ensemble(self, request: InferRequest) -> dict[str, np.ndarray]:
        assert self._ensemble is not None  # internal invariant: built as ensemble or scheduled
        start_ns = time.monotonic_ns()
        self.stats.request_started()
        ok, reason = False, OTHER
        try:
            result = await self._ensemble.run(request)
            ok = True
            return result
        except asyncio.CancelledError:
            reason = CANCELED
            raise
        except InferError as e:  # a step refused by its scheduler, or failed in its backend
            reason = REJECTED if e.kind is ErrorKind.OVERLOADED else BACKEND
            raise
        finally:
            elapsed = time.monotonic_ns() - start_ns
            self.stats.request_done(ok, elapsed, 0 if ok else None, reason)
            if ok:
                self.stats.execution(request.batch_size, 1, 0, elapsed, 0)

    async def close(self) -> None:
        heap.thaw()  # a model loaded at start-up is frozen; its cycles must be collectable (engines/heap.py)
        if self._scheduler is not None:
            await self._scheduler.close()
