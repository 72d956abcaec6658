"""A `triton_python_backend_utils` compatible module, so Triton python models run unchanged.

The python backend registers this module as `sys.modules["triton_python_backend_utils"]`.
Tensors wrap numpy arrays without copying. BLS (`InferenceRequest.exec` /
`async_exec`) calls back into the manager that hosts the calling model; the
backend sets that host in a thread-local around `execute`/`initialize`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

import numpy as np

from engines.classic.dtypes import config_to_wire, numpy_to_wire, wire_to_numpy

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1

_context = threading.local()
_log = logging.getLogger("sluice.python_model")


class TritonError:
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = 1) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r})"


class TritonModelException(Exception):
    pass


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray):
            raise TritonModelException(f"Tensor '{name}' must wrap a numpy array")
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> str:
        return numpy_to_wire(self._array.dtype)

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    @classmethod
    def from_dlpack(cls, name: str, capsule: Any) -> Tensor:
        return cls(name, np.from_dlpack(capsule))


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None,
                 parameters: Any = None) -> None:
        self._outputs = list(output_tensors or [])
        self._error = error
        self._parameters = parameters

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters or {})


class InferenceRequest:
    """A request given to `execute`, or built by a model for a BLS call to another model."""

    def __init__(self, model_name: str = "", requested_output_names: list[str] | None = None,
                 inputs: list[Tensor] | None = None, model_version: int = -1, flags: int = 0,
                 request_id: str = "", correlation_id: int = 0, timeout: int = 0,
                 parameters: dict[str, Any] | str | None = None, priority: int = 0, **_: Any) -> None:
        self.model_name = model_name
        self._outputs = list(requested_output_names or [])
        self._inputs = list(inputs or [])
        self.model_version = model_version
        self._flags = flags
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._timeout_us = timeout
        self._priority = priority
        self._parameters = json.loads(parameters) if isinstance(parameters, str) else dict(parameters or {})

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout_us

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def is_cancelled(self) -> bool:
        return False

    def exec(self, decoupled: bool = False) -> InferenceResponse:
        """Blocking BLS call, from a synchronous `execute`."""
        host = _host()
        future = asyncio.run_coroutine_threadsafe(self._run(host), host.loop)
        return future.result()

    def async_exec(self, decoupled: bool = False) -> asyncio.Future[InferenceResponse]:
        """Awaitable BLS call, from an `async def execute`."""
        host = _host()
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._run(host), host.loop))

    async def _run(self, host: Any) -> InferenceResponse:
        from engines.classic.errors import InferError

        version = "" if self.model_version in (-1, "", None) else str(self.model_version)
        try:
            outputs = await host.infer(
                self.model_name, version, {t.name(): t.as_numpy() for t in self._inputs},
                self._outputs or None, priority=self._priority, timeout_us=self._timeout_us,
                parameters=self._parameters)
        except InferError as exc:
            return InferenceResponse(error=TritonError(exc.message))
        return InferenceResponse([Tensor(k, v) for k, v in outputs.items()])


class NoBLS:
    """The BLS host of a model that cannot make BLS calls (one in its own process): they raise `reason`."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _host() -> Any:
    host = getattr(_context, "host", None)
    if host is None:
        raise TritonModelException("BLS is only available inside a model's initialize/execute")
    if isinstance(host, NoBLS):
        raise TritonModelException(host.reason)
    return host


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("input", []) if t.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("output", []) if t.get("name") == name), None)


def triton_string_to_numpy(triton_type: str) -> type:
    """'TYPE_FP32' (or 'FP32') -> np.float32; BYTES/STRING -> np.object_."""
    return wire_to_numpy(config_to_wire(triton_type)).type


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


class Logger:
    @staticmethod
    def log_info(message: str) -> None:
        _log.info(message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning(message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error(message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug(message)

    @staticmethod
    def log(message: str, level: int = 0) -> None:
        _log.info(message)
