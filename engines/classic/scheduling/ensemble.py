"""Ensembles: a step graph run in-process over the composing models' schedulers.

Tensors flow between steps as the same numpy objects (no copies); each step's
request goes through the composing model's own scheduler, so it batches with
other traffic to that model. Steps whose inputs are ready run concurrently.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from engines.classic.errors import ConfigError, InferError
from engines.classic.proto import EnsembleStep, ModelConfig
from engines.classic.repository.names import check_model_name
from engines.classic.request import InferRequest
from engines.errors import ErrorKind


def validate_ensemble(config: ModelConfig, source: str) -> None:
    """Static checks: every step input is produced by an ensemble input or an earlier step."""
    steps = config.ensemble_scheduling.step
    if not steps:
        raise ConfigError(f"{source}: field 'ensemble_scheduling.step': an ensemble needs at least one step")
    available = {t.name for t in config.input}
    produced: set[str] = set()
    for i, step in enumerate(steps):
        if not step.model_name:
            raise ConfigError(f"{source}: field 'ensemble_scheduling.step[{i}].model_name': missing")
        try:  # a step's model is loaded from repo/<model_name>: it must not name a directory elsewhere
            check_model_name(step.model_name)
        except InferError as exc:
            raise ConfigError(f"{source}: field 'ensemble_scheduling.step[{i}].model_name': {exc.message}") from None
        for out in step.output_map.values():
            if out in produced or out in available:
                raise ConfigError(f"{source}: field 'ensemble_scheduling.step[{i}].output_map': tensor '{out}' "
                                  "is produced more than once")
            produced.add(out)
    known = available | produced
    for i, step in enumerate(steps):
        for model_input, tensor in step.input_map.items():
            if tensor not in known:
                raise ConfigError(f"{source}: field 'ensemble_scheduling.step[{i}].input_map': '{model_input}' "
                                  f"reads '{tensor}', which no ensemble input or step produces")
    for output in config.output:
        if output.name not in produced:
            raise ConfigError(f"{source}: field 'output': ensemble output '{output.name}' is not produced by any step")


def step_models(config: ModelConfig) -> list[str]:
    return list(dict.fromkeys(s.model_name for s in config.ensemble_scheduling.step))


class EnsembleRunner:
    """Runs one ensemble request. `host.infer(...)` is the manager's infer API."""

    def __init__(self, config: ModelConfig, host: Any) -> None:
        self.config = config
        self._host = host

    async def run(self, request: InferRequest) -> dict[str, np.ndarray]:
        tensors: dict[str, np.ndarray] = dict(request.inputs)
        pending = list(self.config.ensemble_scheduling.step)
        while pending:
            ready = [s for s in pending if all(t in tensors for t in s.input_map.values())]
            if not ready:
                raise InferError(f"ensemble '{self.config.name}' cannot make progress: missing tensors",
                                 ErrorKind.INTERNAL)
            results = await asyncio.gather(*(self._step(s, tensors, request) for s in ready))
            for step, produced in zip(ready, results, strict=True):
                tensors.update(produced)
                pending.remove(step)
        wanted = request.outputs if request.outputs is not None else [t.name for t in self.config.output]
        return {name: tensors[name] for name in wanted}

    async def _step(self, step: EnsembleStep, tensors: dict[str, np.ndarray],
                    request: InferRequest) -> dict[str, np.ndarray]:
        inputs = {model_input: tensors[name] for model_input, name in step.input_map.items()}
        version = str(step.model_version) if step.model_version > 0 else ""
        try:
            outputs = await self._host.infer(step.model_name, version, inputs, list(step.output_map.keys()),
                                             priority=request.priority, timeout_us=request.timeout_us)
        except InferError as exc:
            raise InferError(f"in ensemble '{self.config.name}', step '{step.model_name}': {exc.message}",
                             exc.kind) from None
        return {step.output_map[name]: value for name, value in outputs.items()}
