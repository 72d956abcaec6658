"""ModelInferRequest <-> numpy, for the gRPC servicer (raw_input_contents or typed contents)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from engines.classic.dtypes import numpy_to_wire
from engines.classic.errors import invalid
from gateway.kserve import codec

# datatype -> the InferTensorContents field that carries it
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def param_value(p: pb.InferParameter) -> Any:
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def decode_inputs(request: pb.ModelInferRequest, max_elements: int) -> dict[str, np.ndarray]:
    """Numpy inputs of a ModelInferRequest. Every tensor's shape is checked (at most `max_elements`)
    and its payload's size compared with it before anything is converted."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise invalid(f"expected {len(request.inputs)} raw_input_contents, got {len(raw)}")
    inputs: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        name = tensor.name
        if name in inputs:
            raise invalid(f"input '{name}' appears more than once")
        shape = codec.check_shape(name, list(tensor.shape), max_elements)
        if raw:
            if tensor.HasField("contents"):
                raise invalid(f"input '{name}': give its data in raw_input_contents or contents, not both")
            inputs[name] = codec.from_raw(name, tensor.datatype, shape, raw[i])
        else:
            inputs[name] = _from_contents(tensor, shape)
    return inputs


def _from_contents(tensor: pb.ModelInferRequest.InferInputTensor, shape: tuple[int, ...]) -> np.ndarray:
    name = tensor.name
    dtype = codec.wire_dtype(name, tensor.datatype)
    field = _CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise invalid(f"input '{name}': {tensor.datatype} must be sent in raw_input_contents")
    values = getattr(tensor.contents, field)
    count = math.prod(shape)
    if len(values) != count:  # counted on the repeated field itself, before any conversion
        raise invalid(f"input '{name}': got {len(values)} elements, shape {list(shape)} needs {count}")
    if tensor.datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = list(values)
    else:
        try:
            array = np.fromiter(values, dtype=dtype, count=count)
        except (OverflowError, ValueError) as exc:
            raise invalid(f"input '{name}': cannot convert contents to {tensor.datatype}: {exc}") from None
    return array.reshape(shape)


def requested_outputs(request: pb.ModelInferRequest) -> list[str] | None:
    for out in request.outputs:
        if "classification" in out.parameters:
            raise invalid("the classification extension is not supported; request the raw output instead")
    return [o.name for o in request.outputs] or None


def encode_response(model: str, version: str, request_id: str,
                    outputs: dict[str, np.ndarray]) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id)
    for name, array in outputs.items():
        response.outputs.add(name=name, datatype=numpy_to_wire(array.dtype), shape=list(array.shape))
        response.raw_output_contents.append(codec.to_raw(array))
    return response
