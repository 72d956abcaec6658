"""The internal request of the classic path and its validation against a model config."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engines.classic.dtypes import as_bytes_array, numpy_to_wire
from engines.classic.errors import invalid
from engines.classic.limits import check_priority, check_timeout, element_count
from engines.classic.proto import ModelConfig, ModelInput
from engines.classic.repository.config import tensor_wire_type


@dataclass(slots=True)
class InferRequest:
    """One inference on one model version, with inputs already decoded to numpy.

    BYTES tensors are object arrays of `bytes`. `outputs` None means every output
    of the model. `batch_size` and `batch_key` are filled by `validate_request`.
    """

    model: str
    version: str
    inputs: dict[str, np.ndarray]
    outputs: list[str] | None = None
    priority: int = 0
    timeout_us: int = 0
    request_id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 1
    batch_key: Hashable = ()


def validate_request(config: ModelConfig, request: InferRequest, max_elements: int) -> None:
    """Check parameters, names, dtypes and shapes against the config; set batch_size and batch_key.

    Raises InferError(INVALID_ARG) with Triton-style messages. BYTES inputs given
    as str/bytes arrays are normalised to object arrays of bytes in place.
    """
    RequestSpec(config).validate(request, max_elements)


class RequestSpec:
    """What `validate_request` reads from a config, read once per loaded model version."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.name = config.name
        self.batching = config.max_batch_size > 0
        self.declared = {t.name: t for t in config.input}
        self.wire = {t.name: tensor_wire_type(t) for t in config.input}
        self.required = [n for n, t in self.declared.items() if not t.optional]
        self.full_dims = {t.name: [-1, *t.dims] if self.batching else list(t.dims) for t in config.input}
        self.known_outputs = frozenset(t.name for t in config.output)

    def validate(self, request: InferRequest, max_elements: int) -> None:
        config, name = self.config, self.name
        check_priority(config, request.priority)
        check_timeout(request.timeout_us)
        declared = self.declared
        for input_name in request.inputs:
            if input_name not in declared:
                raise invalid(f"unexpected inference input '{input_name}' for model '{name}'")
        missing = [n for n in self.required if n not in request.inputs]
        if missing:
            raise invalid(f"expected {len(declared)} inputs but got {len(request.inputs)} inputs for model "
                          f"'{name}'; missing {missing}")
        batch_sizes = set()
        key: list[tuple[str, tuple[int, ...]]] = []
        for input_name, array in request.inputs.items():
            tensor = declared[input_name]
            element_count(input_name, array.shape, max_elements)
            array = _check_dtype(name, tensor, array, self.wire[input_name])
            request.inputs[input_name] = array
            _check_shape(config, tensor, array.shape, self.full_dims[input_name])
            if self.batching:
                batch_sizes.add(int(array.shape[0]))
                if not tensor.allow_ragged_batch:
                    key.append((input_name, tuple(array.shape[1:])))
        if len(batch_sizes) > 1:
            raise invalid(f"inputs of model '{name}' disagree on the batch size: {sorted(batch_sizes)}")
        request.batch_size = batch_sizes.pop() if batch_sizes else 1
        if self.batching and request.batch_size > config.max_batch_size:
            raise invalid(f"inference request batch-size must be <= {config.max_batch_size} for '{name}'")
        request.batch_key = tuple(sorted(key)) if len(key) > 1 else tuple(key)
        if request.outputs is not None:
            for out in request.outputs:
                if out not in self.known_outputs:
                    raise invalid(f"unexpected inference output '{out}' for model '{name}'")


def _check_dtype(model: str, tensor: ModelInput, array: np.ndarray, want: str) -> np.ndarray:
    try:
        got = numpy_to_wire(array.dtype)
    except ValueError:
        got = str(array.dtype)
    if got != want:
        raise invalid(f"inference input '{tensor.name}' data-type is '{got}', but model '{model}' "
                      f"expects '{want}'")
    return as_bytes_array(array) if want == "BYTES" else array


def _check_shape(config: ModelConfig, tensor: ModelInput, shape: tuple[int, ...], full: list[int]) -> None:
    ok = len(shape) == len(full) and all(d == -1 or d == s for d, s in zip(full, shape, strict=True))
    if config.max_batch_size > 0 and len(shape) >= 1 and shape[0] < 1:
        ok = False
    if not ok:
        raise invalid(f"unexpected shape for input '{tensor.name}' for model '{config.name}'. Expected "
                      f"{full}, got {list(shape)}")
