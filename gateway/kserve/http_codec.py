"""The KServe v2 HTTP infer body: JSON, plus Triton's binary tensor extension.

Request: a JSON header, optionally followed by binary tensor data; the header's
length is given by `Inference-Header-Content-Length`. Each input whose
`parameters.binary_data_size` is set takes that many bytes, in order.
Response: outputs go binary when the output (or the request, through
`binary_data_output`) asks for it; the JSON header length is then returned in
`Inference-Header-Content-Length`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from engines.classic.dtypes import numpy_to_wire
from engines.classic.errors import invalid
from gateway.kserve import codec
from gateway.kserve.views import int_param
from gateway.limits import check_json_depth


@dataclass(slots=True)
class HttpInferRequest:
    request_id: str
    inputs: dict[str, np.ndarray]
    outputs: list[str] | None  # None: all outputs
    binary_outputs: set[str] = field(default_factory=set)
    default_binary: bool = False
    priority: int = 0
    timeout_us: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)


def decode_request(body: bytes, header_length: str | None, max_elements: int) -> HttpInferRequest:
    """Parse an infer body; raises InferError(INVALID_ARG) for anything malformed or a tensor over
    `max_elements` elements (refused before its data is read)."""
    if header_length is not None:
        try:
            length = int(header_length)
        except ValueError:
            raise invalid("Inference-Header-Content-Length must be an integer") from None
        if not 0 <= length <= len(body):
            raise invalid(f"Inference-Header-Content-Length {length} exceeds the body size {len(body)}")
    else:
        length = len(body)
    text = body[:length]
    check_json_depth(text)
    header = _parse(text)
    if not isinstance(header, dict):
        raise invalid("the request body must be a JSON object")
    params = _dict(header.get("parameters"), "parameters")
    raw = memoryview(body)[length:]
    inputs, consumed = _decode_inputs(header.get("inputs"), raw, max_elements)
    if consumed != len(raw):
        raise invalid(f"{len(raw) - consumed} bytes of binary data follow the last binary input")
    outputs, binary = _decode_outputs(header.get("outputs"))
    request_id = header.get("id", "")
    return HttpInferRequest(
        request_id=str(request_id) if request_id is not None else "", inputs=inputs, outputs=outputs,
        binary_outputs=binary, default_binary=bool(params.get("binary_data_output", False)),
        priority=int_param(params, "priority"), timeout_us=int_param(params, "timeout"),
        parameters={k: v for k, v in params.items() if k not in ("binary_data_output", "priority", "timeout")})


def _parse(text: bytes) -> Any:
    """orjson, or the standard library where orjson refuses (NaN, integers past 64 bits: the standard
    library accepts them, and the tensor checks then answer as they always did)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: arrays or objects nested too deeply
        raise invalid(f"failed to parse the request JSON: {exc}") from None


def _dict(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"'{what}' must be a JSON object")
    return value


def _decode_inputs(specs: Any, raw: memoryview, max_elements: int) -> tuple[dict[str, np.ndarray], int]:
    if not isinstance(specs, list) or not specs:
        raise invalid("'inputs' must be a non-empty array")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for spec in specs:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise invalid("each input needs a 'name'")
        name = spec["name"]
        if name in inputs:
            raise invalid(f"input '{name}' appears more than once")
        datatype = str(spec.get("datatype"))
        shape = codec.check_shape(name, spec.get("shape"), max_elements)
        codec.wire_dtype(name, datatype)
        params = _dict(spec.get("parameters"), f"inputs['{name}'].parameters")
        if "binary_data_size" in params:
            size = params["binary_data_size"]
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise invalid(f"input '{name}': binary_data_size must be a non-negative integer")
            if offset + size > len(raw):
                raise invalid(f"input '{name}': binary_data_size {size} but only {len(raw) - offset} bytes of "
                              "binary data remain")
            inputs[name] = codec.from_raw(name, datatype, shape, raw[offset:offset + size])
            offset += size
        elif "data" in spec:
            inputs[name] = codec.from_json_data(name, datatype, shape, spec["data"])
        else:
            raise invalid(f"input '{name}' has neither 'data' nor parameters.binary_data_size")
    return inputs, offset


def _decode_outputs(specs: Any) -> tuple[list[str] | None, set[str]]:
    if specs is None:
        return None, set()
    if not isinstance(specs, list):
        raise invalid("'outputs' must be an array")
    names: list[str] = []
    binary: set[str] = set()
    for spec in specs:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise invalid("each requested output needs a 'name'")
        params = _dict(spec.get("parameters"), f"outputs['{spec['name']}'].parameters")
        if params.get("classification"):
            raise invalid("the classification extension is not supported; request the raw output instead")
        names.append(spec["name"])
        if params.get("binary_data", False):
            binary.add(spec["name"])
    return names or None, binary


def encode_response(model: str, version: str, req: HttpInferRequest,
                    outputs: dict[str, np.ndarray]) -> tuple[bytes, int | None]:
    """Returns (body, json_header_length or None when the body is pure JSON)."""
    out_specs = []
    blobs: list[bytes] = []
    for name, array in outputs.items():
        spec: dict[str, Any] = {"name": name, "datatype": numpy_to_wire(array.dtype), "shape": list(array.shape)}
        if name in req.binary_outputs or req.default_binary:
            blob = codec.to_raw(array)
            spec["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            spec["data"] = codec.to_json_data(array)
        out_specs.append(spec)
    header: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": out_specs}
    if req.request_id:
        header["id"] = req.request_id
    if blobs and len(blobs) == len(out_specs):  # names, types, shapes, sizes, the id: no float to write
        try:
            head = orjson.dumps(header)
            return head + b"".join(blobs), len(head)
        except orjson.JSONEncodeError:  # an id holding a lone surrogate, which the standard library escapes
            pass
    head = json.dumps(header, separators=(",", ":")).encode()  # JSON data may hold NaN, which orjson nulls
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)
