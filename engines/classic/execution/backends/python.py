"""Python backend: `model.py` with Triton's `TritonPythonModel`, or Sluice's stacked-numpy `SluiceModel`.

- `TritonPythonModel`: `initialize(args)`, `execute(requests) -> responses`
  (sync or `async def`), `finalize()`, using `triton_python_backend_utils`
  (our `pb_utils`). Models run in-process, each instance in its own object.
- `SluiceModel`: `initialize(args)` (optional) and
  `execute_batch(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]`; the
  scheduler hands it one stacked batch and splits the outputs back.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import itertools
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from engines.classic.errors import ConfigError, InferError
from engines.classic.execution.backends import base, pb_utils
from engines.classic.execution.threads import describe
from engines.classic.proto import ModelConfig
from engines.classic.repository.config import to_json
from engines.errors import ErrorKind

if TYPE_CHECKING:
    from engines.classic.request import InferRequest

sys.modules.setdefault("triton_python_backend_utils", pb_utils)
_module_ids = itertools.count()
# A model's `TritonError(message, code)` keeps its meaning (INVALID_ARG is the client's fault: a 400);
# UNKNOWN and INTERNAL are the server's.
_ERROR_KINDS = {pb_utils.TritonError.NOT_FOUND: ErrorKind.NOT_FOUND,
                pb_utils.TritonError.INVALID_ARG: ErrorKind.INVALID_ARG,
                pb_utils.TritonError.UNAVAILABLE: ErrorKind.UNAVAILABLE,
                pb_utils.TritonError.UNSUPPORTED: ErrorKind.UNSUPPORTED,
                pb_utils.TritonError.ALREADY_EXISTS: ErrorKind.ALREADY_EXISTS,
                pb_utils.TritonError.CANCELLED: ErrorKind.CANCELLED}


@contextlib.contextmanager
def bls_host(host: Any) -> Iterator[None]:
    """Make `host` the target of BLS calls made on this thread."""
    previous = getattr(pb_utils._context, "host", None)
    pb_utils._context.host = host
    try:
        yield
    finally:
        pb_utils._context.host = previous


def load_python_instance(config: ModelConfig, version_dir: Path, index: int, host: Any) -> base.Backend:
    path = base.model_file(config, version_dir, "model.py")
    module = _import(path, config.name)
    args = {
        "model_config": to_json(config),
        "model_instance_kind": "CPU",
        "model_instance_name": f"{config.name}_{index}",
        "model_instance_device_id": "0",
        "model_repository": str(version_dir.parent),
        "model_version": version_dir.name,
        "model_name": config.name,
    }
    if hasattr(module, "TritonPythonModel"):
        return TritonPythonBackend(config, module.TritonPythonModel(), args, host)
    if hasattr(module, "SluiceModel"):
        return NumpyPythonBackend(config, module.SluiceModel(), args, host)
    raise ConfigError(f"{path}: defines neither TritonPythonModel nor SluiceModel")


def _import(path: Path, model_name: str) -> ModuleType:
    """Import model.py under a unique module name (each instance gets its own module, as in Triton)."""
    name = f"sluice_python_model_{next(_module_ids)}_{model_name}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so pickling, dataclasses and tracebacks can find it
    # Triton puts the version directory on sys.path so model.py can import its neighbours.
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # model code: a sys.exit() at import fails this model only
        sys.modules.pop(name, None)
        raise ConfigError(f"{path}: import failed: {type(exc).__name__}: {exc}") from None
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(path.parent))
    return module


def _initialize(model: Any, args: dict[str, str], host: Any, source: str) -> None:
    init = getattr(model, "initialize", None)
    if init is None:
        return
    try:
        with bls_host(host):
            result = init(args)
            if inspect.iscoroutine(result):
                asyncio.run(result)
    except BaseException as exc:  # model code: SystemExit in initialize() fails this model only
        raise ConfigError(f"{source}: initialize() failed: {type(exc).__name__}: {exc}") from None


class TritonPythonBackend(base.Backend):
    def __init__(self, config: ModelConfig, model: Any, args: dict[str, str], host: Any) -> None:
        super().__init__(config)
        self._model = model
        self._host = host
        _initialize(model, args, host, f"model '{config.name}'")
        self._loop = asyncio.new_event_loop() if inspect.iscoroutinefunction(model.execute) else None
        self._output_config = {t.name: t for t in config.output}

    def execute(self, requests: list[InferRequest]) -> list[dict[str, np.ndarray] | InferError]:
        t0 = time.perf_counter_ns()
        all_outputs = [t.name for t in self.config.output]
        pb_requests = [
            pb_utils.InferenceRequest(
                self.config.name, r.outputs if r.outputs is not None else all_outputs,
                [pb_utils.Tensor(k, v) for k, v in r.inputs.items()], request_id=r.request_id,
                parameters=r.parameters, timeout=r.timeout_us, priority=r.priority)
            for r in requests
        ]
        t1 = time.perf_counter_ns()
        try:
            with bls_host(self._host):
                responses = self._model.execute(pb_requests)
                if self._loop is not None:
                    responses = self._loop.run_until_complete(responses)
        except BaseException as exc:  # a failing model (even SystemExit) fails its batch, not the server
            self.timings = base.ComputeTimes(t1 - t0, time.perf_counter_ns() - t1, 0)
            return [InferError(f"model '{self.config.name}' execute() failed: {describe(exc)}", ErrorKind.INTERNAL)
                    ] * len(requests)
        t2 = time.perf_counter_ns()
        results = self._convert(requests, responses)
        self.timings = base.ComputeTimes(t1 - t0, t2 - t1, time.perf_counter_ns() - t2)
        return results

    def _convert(self, requests: list[InferRequest], responses: Any) -> list[dict[str, np.ndarray] | InferError]:
        if not isinstance(responses, list) or len(responses) != len(requests):
            got = len(responses) if isinstance(responses, list) else type(responses).__name__
            err = InferError(f"model '{self.config.name}' returned {got} responses for {len(requests)} requests",
                             ErrorKind.INTERNAL)
            return [err] * len(requests)
        results: list[dict[str, np.ndarray] | InferError] = []
        for req, resp in zip(requests, responses, strict=True):
            if resp.has_error():
                error = resp.error()
                results.append(InferError(error.message(), _ERROR_KINDS.get(error.code(), ErrorKind.INTERNAL)))
                continue
            produced = {t.name(): t.as_numpy() for t in resp.output_tensors()}
            wanted = req.outputs if req.outputs is not None else list(produced)
            missing = [n for n in wanted if n not in produced]
            if missing:
                results.append(InferError(f"model '{self.config.name}' did not produce {missing}", ErrorKind.INTERNAL))
                continue
            results.append({n: self._coerce(n, produced[n]) for n in wanted})
        return results

    def _coerce(self, name: str, array: np.ndarray) -> np.ndarray:
        tensor = self._output_config.get(name)
        return base._coerce(tensor, np.asarray(array)) if tensor is not None else array

    def close(self) -> None:
        _finalize(self._model, self._host)
        if self._loop is not None:
            self._loop.close()


class NumpyPythonBackend(base.StackedBackend):
    def __init__(self, config: ModelConfig, model: Any, args: dict[str, str], host: Any) -> None:
        super().__init__(config)
        self._model = model
        self._host = host
        if not callable(getattr(model, "execute_batch", None)):
            raise ConfigError(f"model '{config.name}': SluiceModel needs execute_batch(inputs) -> outputs")
        _initialize(model, args, host, f"model '{config.name}'")

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with bls_host(self._host):
            outputs = self._model.execute_batch(inputs)
        if not isinstance(outputs, dict):
            raise TypeError(f"execute_batch returned {type(outputs).__name__}, not a dict of arrays")
        return outputs

    def close(self) -> None:
        _finalize(self._model, self._host)


def _finalize(model: Any, host: Any) -> None:
    finalize = getattr(model, "finalize", None)
    if finalize is not None:
        with contextlib.suppress(BaseException), bls_host(host):  # model code, and the model is going anyway
            finalize()

