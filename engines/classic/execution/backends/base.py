"""The backend seam: one model instance that executes a batch of requests.

Contract:
- `execute(requests)` is called from a worker thread, one batch at a time per
  instance (the scheduler never runs two batches on one instance concurrently).
- It returns exactly one result per request, in order: a dict of output name to
  numpy array, or an InferError for that request alone.
- After each call `timings` holds the batch's compute_input/infer/output times.
- `close()` releases the instance; it is called once, after the last execute.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engines.classic.dtypes import wire_to_numpy
from engines.classic.errors import ConfigError, InferError
from engines.classic.execution.threads import describe
from engines.classic.proto import ModelConfig, ModelOutput
from engines.classic.repository.config import tensor_wire_type
from engines.errors import ErrorKind

if TYPE_CHECKING:
    from engines.classic.request import InferRequest

def model_file(config: ModelConfig, version_dir: Path, default: str) -> Path:
    """The file a backend loads; raises ConfigError naming the config field when absent or outside the model.

    `default_model_filename` is a file name inside the version directory: an absolute
    path, a NUL, a '..' part or a symlink that resolves outside the model's directory
    is refused, so a config cannot make a backend load (or run) a file from elsewhere.
    """
    field = "default_model_filename" if config.default_model_filename else "(default file)"
    source = version_dir.parent / "config.pbtxt"
    name = config.default_model_filename or default
    if "\0" in name or os.path.isabs(name) or ".." in Path(name).parts:
        raise ConfigError(f"{source}: field '{field}': '{name[:200]}' must be a file name inside the version "
                          "directory")
    path = version_dir / name
    if not path.exists():
        raise ConfigError(f"{source}: field '{field}': model file {path} not found")
    if not path.resolve().is_relative_to(version_dir.parent.resolve()):
        raise ConfigError(f"{source}: field '{field}': model file {path} resolves outside the model directory "
                          f"({path.resolve()})")
    return path


@dataclass(slots=True)
class ComputeTimes:
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0

    @property
    def total_ns(self) -> int:
        return self.input_ns + self.infer_ns + self.output_ns


class Backend(ABC):
    # True when execute() returns by the model's time limit on its own (a model in its own process
    # is killed); otherwise the scheduler enforces the limit by abandoning the instance.
    enforces_time_limit = False
    inline_ok = False  # its execute may run on the event loop when measured cheap (engines/classic/execution/inline.py)

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.timings = ComputeTimes()

    @abstractmethod
    def execute(self, requests: list[InferRequest]) -> list[dict[str, np.ndarray] | InferError]: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class StackedBackend(Backend):
    """A backend whose model takes one stacked numpy batch: `run(inputs) -> outputs`.

    Requests are concatenated along the batch dimension (no copy for a single
    request), `reshape` from the config is applied both ways, and the outputs are
    split back by each request's batch size.
    """

    @abstractmethod
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def execute(self, requests: list[InferRequest]) -> list[dict[str, np.ndarray] | InferError]:
        t0 = time.perf_counter_ns()
        batching = self.config.max_batch_size > 0
        stacked = _stack(self.config, requests, batching)
        t1 = time.perf_counter_ns()
        try:
            outputs = self.run(stacked)
        except InferError as exc:
            self.timings = ComputeTimes(t1 - t0, time.perf_counter_ns() - t1, 0)
            return [exc] * len(requests)
        except BaseException as exc:  # a model failure (even SystemExit from model code) fails this batch only
            self.timings = ComputeTimes(t1 - t0, time.perf_counter_ns() - t1, 0)
            failed = InferError(f"model '{self.config.name}' failed: {describe(exc)}", ErrorKind.INTERNAL)
            return [failed] * len(requests)
        t2 = time.perf_counter_ns()
        results = _split(self.config, requests, outputs, batching)
        self.timings = ComputeTimes(t1 - t0, t2 - t1, time.perf_counter_ns() - t2)
        return results


def _stack(config: ModelConfig, requests: list[InferRequest], batching: bool) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for tensor in config.input:
        if tensor.name not in requests[0].inputs:
            continue
        parts = [r.inputs[tensor.name] for r in requests]
        if tensor.allow_ragged_batch:
            parts = [p.reshape(-1) for p in parts]
        array = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        if tensor.HasField("reshape"):
            lead = [array.shape[0]] if batching else []
            array = array.reshape(lead + list(tensor.reshape.shape))
        out[tensor.name] = array
    return out


def _split(config: ModelConfig, requests: list[InferRequest], outputs: dict[str, np.ndarray],
           batching: bool) -> list[dict[str, np.ndarray] | InferError]:
    results: list[dict[str, np.ndarray] | InferError] = [{} for _ in requests]
    rows = sum(r.batch_size for r in requests)
    for tensor in config.output:
        array = outputs.get(tensor.name)
        if array is None:
            missing = InferError(f"model '{config.name}' did not produce output '{tensor.name}'", ErrorKind.INTERNAL)
            return [missing] * len(requests)
        array = _coerce(tensor, np.asarray(array))
        if tensor.HasField("reshape"):
            array = array.reshape(([array.shape[0]] if batching else []) + [
                d if d != -1 else -1 for d in tensor.dims])
        if batching and array.shape[0] != rows:
            return [InferError(f"model '{config.name}' output '{tensor.name}' has batch {array.shape[0]}, "
                               f"expected {rows}", ErrorKind.INTERNAL)] * len(requests)
        start = 0
        for i, req in enumerate(requests):
            if req.outputs is None or tensor.name in req.outputs:
                part = array[start:start + req.batch_size] if batching else array
                results[i][tensor.name] = part  # type: ignore[index]
            start += req.batch_size
    return results


def _coerce(tensor: ModelOutput, array: np.ndarray) -> np.ndarray:
    want = wire_to_numpy(tensor_wire_type(tensor))
    if want == np.object_:
        return array if array.dtype == np.object_ else array.astype(np.object_)
    return array if array.dtype == want else array.astype(want)
