"""One loaded model version: its config, instances + scheduler (or ensemble runner), and stats."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from engines.classic.backends import create_instance
from engines.classic.ensemble import EnsembleRunner
from engines.classic.errors import InferError
from engines.classic.proto import ModelConfig
from engines.classic.request import InferRequest, validate_request
from engines.classic.scheduler import Scheduler
from engines.classic.stats import ModelStats


def instance_count(config: ModelConfig) -> int:
    """Sum of instance_group counts; a group with count 0 (unset) means 1, as in Triton."""
    if not config.instance_group:
        return 1
    return sum(max(1, g.count) for g in config.instance_group)


class ModelVersion:
    def __init__(self, config: ModelConfig, version: str, scheduler: Scheduler | None,
                 ensemble: EnsembleRunner | None, stats: ModelStats) -> None:
        self.config = config
        self.version = version
        self.stats = stats
        self._scheduler = scheduler
        self._ensemble = ensemble

    @classmethod
    async def load(cls, config: ModelConfig, version_dir: Path, host: Any) -> ModelVersion:
        """Create instances on worker threads (loading can be slow) and start the scheduler.

        Raises ConfigError when a model file is missing or does not match the config.
        """
        stats = ModelStats(config.name, version_dir.name)
        if config.backend == "ensemble":
            return cls(config, version_dir.name, None, EnsembleRunner(config, host), stats)
        loop = asyncio.get_running_loop()
        instances = []
        try:
            for index in range(instance_count(config)):
                instances.append(await loop.run_in_executor(None, create_instance, config, version_dir, index, host))
        except BaseException:
            for inst in instances:
                inst.close()
            raise
        scheduler = Scheduler(config, instances, stats)
        scheduler.start()
        return cls(config, version_dir.name, scheduler, None, stats)

    async def infer(self, request: InferRequest) -> dict[str, np.ndarray]:
        try:
            validate_request(self.config, request)
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
        ok = False
        try:
            result = await self._ensemble.run(request)
            ok = True
            return result
        finally:
            elapsed = time.monotonic_ns() - start_ns
            self.stats.request_done(ok, elapsed, 0 if ok else None)
            if ok:
                self.stats.execution(request.batch_size, 1, 0, elapsed, 0)

    async def close(self) -> None:
        if self._scheduler is not None:
            await self._scheduler.close()
