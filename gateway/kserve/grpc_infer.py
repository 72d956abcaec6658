"""ModelInferRequest <-> numpy, for the gRPC servicer (raw_input_contents or typed contents)."""

from __future__ import annotations

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


def decode_inputs(request: pb.ModelInferRequest) -> dict[str, np.ndarray]:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise invalid(f"expected {len(request.inputs)} raw_input_contents, got {len(raw)}")
    inputs: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        name = tensor.name
        if name in inputs:
            raise invalid(f"input '{name}' appears more than once")
        shape = codec.check_shape(name, list(tensor.shape))
        dtype = codec.wire_dtype(name, tensor.datatype)
        if raw:
            inputs[name] = codec.from_raw(name, tensor.datatype, shape, raw[i])
            continue
        field = _CONTENTS_FIELD.get(tensor.datatype)
        if field is None:
            raise invalid(f"input '{name}': {tensor.datatype} must be sent in raw_input_contents")
        values = list(getattr(tensor.contents, field))
        count = int(np.prod(shape, dtype=np.int64))
        if len(values) != count:
            raise invalid(f"input '{name}': got {len(values)} elements, shape {list(shape)} needs {count}")
        if tensor.datatype == "BYTES":
            array = np.empty(count, dtype=np.object_)
            array[:] = values
        else:
            array = np.array(values, dtype=dtype)
        inputs[name] = array.reshape(shape)
    return inputs


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
