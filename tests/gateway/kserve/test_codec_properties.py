"""Properties of the KServe v2 tensor parser (`http_codec.decode_request`, `codec`).

A hostile client controls every byte of an infer body and its header length, so:
- nothing but the domain error (`SluiceError`, here `InferError(INVALID_ARG)`) ever escapes;
- parsing never allocates more than the body itself could describe, whatever shape it declares;
- every tensor a client can send in any datatype (BYTES with arbitrary bytes included) comes back
  unchanged through the binary extension, the JSON form and the response encoder.
"""

from __future__ import annotations

import json
import struct
import tracemalloc
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engines.classic.dtypes import WIRE_TYPES, wire_to_numpy
from engines.classic.limits import ClassicLimits
from engines.errors import ErrorKind, SluiceError
from gateway.kserve import codec
from gateway.kserve.http_codec import HttpInferRequest, decode_request, encode_response
from tests.properties import bounded

MAX_ELEMENTS = ClassicLimits().max_tensor_elements  # the server's default bound

# What one byte of body can become while parsing: Python objects for JSON, a copy for raw data.
BYTES_PER_BODY_BYTE = 64
SLACK_BYTES = 1 << 20


def _decode(body: bytes, header_length: str | None) -> HttpInferRequest | None:
    """decode_request, with a domain error read as a refusal (None)."""
    try:
        return decode_request(body, header_length, MAX_ELEMENTS)
    except SluiceError as exc:
        assert exc.kind is ErrorKind.INVALID_ARG, exc
        assert exc.message
        return None


# ---- arbitrary input --------------------------------------------------------------------------
header_lengths = st.one_of(st.none(), st.integers(-5, 5000).map(str),
                           st.text(alphabet="0123456789-+ x_\u0661", max_size=6))


@bounded(300)
@given(body=st.binary(max_size=1024), header_length=header_lengths)
def test_arbitrary_bytes_only_raise_the_domain_error(body: bytes, header_length: str | None) -> None:
    _decode(body, header_length)


dims = st.one_of(st.integers(0, 4), st.integers(0, 2**70), st.sampled_from([2**31, 2**32, 2**63 - 1, 2**63, 2**64]))
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**65), 2**65), st.floats(), st.text(max_size=4))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=12)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`good` four times in five: a field must pass for the parser to reach the next one."""
    return st.integers(0, 4).flatmap(lambda i: bad if i == 0 else good)


@st.composite
def hostile_inputs(draw: st.DrawFn) -> dict[str, Any]:
    """One input spec: the real field names, with values of any type and any size."""
    spec: dict[str, Any] = {"name": draw(mostly(st.sampled_from(["x", "y"]), json_scalars)),
                            "datatype": draw(mostly(st.sampled_from(sorted(WIRE_TYPES)), json_scalars)),
                            "shape": draw(mostly(st.lists(dims, max_size=4),
                                                 st.one_of(st.lists(st.just(1), min_size=60, max_size=70),
                                                           st.lists(json_scalars, max_size=3), json_scalars)))}
    if draw(st.booleans()):
        spec["parameters"] = {"binary_data_size": draw(mostly(st.integers(0, 64),
                                                              st.one_of(st.integers(-2, 2**66), json_scalars)))}
    elif draw(st.integers(0, 4)):
        spec["data"] = draw(mostly(st.lists(st.integers(0, 3), max_size=8), json_values))
    return spec


@st.composite
def hostile_bodies(draw: st.DrawFn) -> tuple[bytes, str | None]:
    header: dict[str, Any] = {"inputs": draw(st.lists(hostile_inputs(), max_size=3))}
    if draw(st.booleans()):
        header["outputs"] = draw(st.one_of(
            st.lists(st.fixed_dictionaries({"name": st.text(max_size=3)},
                                           optional={"parameters": json_values}), max_size=3),
            json_values))
    if draw(st.booleans()):
        header["parameters"] = draw(st.dictionaries(
            st.sampled_from(["binary_data_output", "priority", "timeout", "other"]), json_scalars, max_size=3))
    if draw(st.integers(0, 9)) == 0:
        header["id"] = draw(json_values)
    head = json.dumps(header).encode()
    tail = draw(st.binary(max_size=300))
    length = str(len(head)) if tail or draw(st.booleans()) else None
    return head + tail, length


@bounded(400)
@given(case=hostile_bodies())
def test_hostile_headers_refuse_without_allocating_what_they_declare(case: tuple[bytes, str | None]) -> None:
    body, header_length = case
    tracemalloc.start()
    try:
        _decode(body, header_length)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= BYTES_PER_BODY_BYTE * len(body) + SLACK_BYTES, (peak, len(body))


def test_a_shape_larger_than_numpy_can_hold_is_a_refusal() -> None:
    for shape in ([2**32, 2**32], [2**70], [0, 2**63], [1] * 65):
        head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": shape,
                                       "parameters": {"binary_data_size": 0}}]}).encode()
        assert _decode(head, str(len(head))) is None, shape
        head = json.dumps({"inputs": [{"name": "x", "datatype": "BYTES", "shape": shape, "data": []}]}).encode()
        assert _decode(head, None) is None, shape


def test_deeply_nested_json_is_a_refusal() -> None:
    assert _decode(b"[" * 100_000, None) is None
    assert _decode(b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": ' + b"[" * 100_000,
                   None) is None


# ---- round trips ------------------------------------------------------------------------------
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def tensors(draw: st.DrawFn) -> tuple[str, np.ndarray]:
    datatype = draw(st.sampled_from(sorted(WIRE_TYPES)))
    shape = draw(shapes)
    if datatype == "BYTES":
        items = draw(st.lists(st.binary(max_size=12), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
        array = np.empty(len(items), dtype=np.object_)
        array[:] = items
        return datatype, array.reshape(shape)
    # Any bit pattern: NaNs, infinities, subnormals and -0.0 must survive the binary form.
    return datatype, draw(hnp.arrays(wire_to_numpy(datatype), shape))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype == np.object_:
        return b.dtype == np.object_ and a.shape == b.shape and a.tolist() == b.tolist()
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _binary_body(named: dict[str, tuple[str, np.ndarray]]) -> tuple[bytes, str]:
    """An infer body as tritonclient sends it: JSON header, then each input's raw bytes."""
    specs, blobs = [], []
    for name, (datatype, array) in named.items():
        blob = codec.to_raw(array)
        specs.append({"name": name, "datatype": datatype, "shape": list(array.shape),
                      "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
    head = json.dumps({"inputs": specs, "parameters": {"binary_data_output": True}}).encode()
    return head + b"".join(blobs), str(len(head))


@bounded(300)
@given(named=st.dictionaries(st.sampled_from(["a", "b", "c"]), tensors(), min_size=1, max_size=3))
def test_binary_round_trip_of_every_datatype(named: dict[str, tuple[str, np.ndarray]]) -> None:
    body, length = _binary_body(named)
    req = decode_request(body, length, MAX_ELEMENTS)
    assert set(req.inputs) == set(named)
    for name, (datatype, array) in named.items():
        assert _same(req.inputs[name], array), (datatype, array, req.inputs[name])


@bounded(200)
@given(named=st.dictionaries(st.sampled_from(["a", "b"]), tensors(), min_size=1, max_size=2))
def test_response_encoding_round_trips_through_the_binary_form(named: dict[str, tuple[str, np.ndarray]]) -> None:
    outputs = {name: array for name, (_, array) in named.items()}
    req = HttpInferRequest(request_id="r", inputs={}, outputs=None, default_binary=True)
    payload, header_length = encode_response("m", "1", req, outputs)
    assert header_length is not None
    header = json.loads(payload[:header_length])
    offset = header_length
    for spec in header["outputs"]:
        size = spec["parameters"]["binary_data_size"]
        array = codec.from_raw(spec["name"], spec["datatype"], tuple(spec["shape"]), payload[offset:offset + size])
        offset += size
        assert spec["datatype"] == named[spec["name"]][0]
        assert _same(array, outputs[spec["name"]])
    assert offset == len(payload)


finite = {"allow_nan": False, "allow_infinity": False}


@st.composite
def json_tensors(draw: st.DrawFn) -> tuple[str, np.ndarray]:
    """Tensors that JSON can carry exactly: finite numbers, UTF-8 strings."""
    datatype = draw(st.sampled_from(sorted(WIRE_TYPES)))
    shape = draw(shapes)
    if datatype == "BYTES":
        items = draw(st.lists(st.text(max_size=8).map(str.encode), min_size=int(np.prod(shape)),
                              max_size=int(np.prod(shape))))
        array = np.empty(len(items), dtype=np.object_)
        array[:] = items
        return datatype, array.reshape(shape)
    dtype = wire_to_numpy(datatype)
    elements = hnp.from_dtype(dtype, **finite) if dtype.kind == "f" else None
    return datatype, draw(hnp.arrays(dtype, shape, elements=elements))


def _strings(nested: object) -> object:
    """Nested lists as JSON carries them: BYTES elements as UTF-8 strings (empty dimensions too)."""
    if isinstance(nested, list):
        return [_strings(x) for x in nested]
    return nested.decode() if isinstance(nested, bytes) else nested


@bounded(300)
@given(tensor=json_tensors(), nested=st.booleans())
def test_json_round_trip_of_every_datatype(tensor: tuple[str, np.ndarray], nested: bool) -> None:
    datatype, array = tensor
    data = codec.to_json_data(array)
    if nested and array.ndim > 1:
        data = _strings(array.tolist())
    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": list(array.shape), "data": data}]})
    req = decode_request(body.encode(), None, MAX_ELEMENTS)
    assert _same(req.inputs["x"], array.astype(req.inputs["x"].dtype) if datatype != "BYTES" else array)
    assert req.inputs["x"].dtype == wire_to_numpy(datatype)


@bounded(200)
@given(items=st.lists(st.binary(max_size=20), min_size=1, max_size=6), data=st.data())
def test_truncated_bytes_data_is_refused(items: list[bytes], data: st.DataObject) -> None:
    raw = b"".join(struct.pack("<I", len(i)) + i for i in items)
    cut = data.draw(st.integers(0, len(raw) - 1))
    # Losing any byte loses part of a prefix, part of an element, or whole elements.
    assert _decode_raw_bytes(raw[:cut], len(items)) is None


def _decode_raw_bytes(raw: bytes, count: int) -> np.ndarray | None:
    try:
        return codec.from_raw("x", "BYTES", (count,), raw)
    except SluiceError as exc:
        assert exc.kind is ErrorKind.INVALID_ARG
        return None
