"""Request validation against a config, and the KServe tensor codec (raw, BYTES prefixes, JSON)."""

from __future__ import annotations

import json
import struct
import sys

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from engines.classic.errors import InferError
from engines.classic.request import InferRequest, validate_request
from engines.errors import ErrorKind
from gateway.kserve import codec
from gateway.kserve.http_codec import decode_request, encode_response

CONFIG = text_format.Parse('''
name: "m" backend: "python" max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 2 ] }, { name: "s" data_type: TYPE_STRING dims: [ 1 ]
          optional: true } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
''', mc.ModelConfig())


def _req(**inputs) -> InferRequest:
    return InferRequest("m", "1", inputs)


def test_valid_request_sets_batch_size_and_key():
    r = _req(x=np.zeros((3, 5, 2), np.float32))
    validate_request(CONFIG, r, 1 << 20)
    assert r.batch_size == 3 and r.batch_key == (("x", (5, 2)),)


def test_strings_become_bytes():
    r = _req(x=np.zeros((1, 1, 2), np.float32), s=np.array([["hé"]]))
    validate_request(CONFIG, r, 1 << 20)
    assert r.inputs["s"].dtype == object and r.inputs["s"][0, 0] == "hé".encode()


@pytest.mark.parametrize("inputs, fragment", [
    ({"x": np.zeros((1, 5, 3), np.float32)}, "unexpected shape"),
    ({"x": np.zeros((5, 2), np.float32)}, "unexpected shape"),
    ({"x": np.zeros((1, 5, 2), np.float64)}, "data-type is 'FP64'"),
    ({"x": np.zeros((5, 1, 2), np.float32)}, "batch-size must be <= 4"),
    ({"z": np.zeros((1, 1, 2), np.float32)}, "unexpected inference input 'z'"),
    ({}, "missing ['x']"),
])
def test_invalid_requests(inputs, fragment):
    with pytest.raises(InferError) as err:
        validate_request(CONFIG, _req(**inputs), 1 << 20)
    assert err.value.kind == ErrorKind.INVALID_ARG and fragment in err.value.message


def test_unknown_output_requested():
    r = _req(x=np.zeros((1, 1, 2), np.float32))
    r.outputs = ["nope"]
    with pytest.raises(InferError, match="unexpected inference output"):
        validate_request(CONFIG, r, 1 << 20)


def test_raw_roundtrip_and_short_payload():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert (codec.from_raw("a", "INT32", (2, 3), codec.to_raw(a)) == a).all()
    with pytest.raises(InferError, match="unexpected binary data size"):
        codec.from_raw("a", "INT32", (2, 3), codec.to_raw(a)[:-1])


def test_bytes_prefixes():
    arr = np.array([b"ab", b"", "c"], dtype=object)
    raw = codec.to_raw(arr)
    assert raw == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0) + struct.pack("<I", 1) + b"c"
    assert codec.from_raw("s", "BYTES", (3,), raw).tolist() == [b"ab", b"", b"c"]
    with pytest.raises(InferError, match="runs past the end"):
        codec.from_raw("s", "BYTES", (3,), raw[:-1])
    with pytest.raises(InferError, match="needs 4"):
        codec.from_raw("s", "BYTES", (4,), raw)


def test_json_data():
    assert codec.from_json_data("x", "FP32", (2, 2), [[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert codec.from_json_data("x", "FP32", (2, 2), [1, 2, 3, 4]).dtype == np.float32
    with pytest.raises(InferError, match="ragged"):
        codec.from_json_data("x", "FP32", (2, 2), [[1, 2], [3]])
    with pytest.raises(InferError, match="needs 4"):
        codec.from_json_data("x", "FP32", (2, 2), [1, 2, 3])
    with pytest.raises(InferError, match="must be numbers"):
        codec.from_json_data("x", "INT32", (1,), ["a"])
    with pytest.raises(InferError, match="unknown datatype"):
        codec.from_json_data("x", "FP8", (1,), [1])


def test_http_binary_request_and_response():
    header = b'{"id":"7","inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}}],' \
             b'"outputs":[{"name":"y","parameters":{"binary_data":true}}]}'
    body = header + np.array([1, 2], np.float32).tobytes()
    req = decode_request(body, str(len(header)), 1 << 20)
    assert req.request_id == "7" and req.inputs["x"].tolist() == [[1.0, 2.0]] and req.binary_outputs == {"y"}
    out, length = encode_response("m", "1", req, {"y": np.array([[3, 4]], np.float32)})
    assert length is not None and out[length:] == np.array([3, 4], np.float32).tobytes()
    with pytest.raises(InferError, match="only 4 bytes"):
        decode_request(header + b"\0" * 4, str(len(header)), 1 << 20)
    with pytest.raises(InferError, match="bytes of binary data follow"):
        decode_request(body + b"\0", str(len(header)), 1 << 20)
    with pytest.raises(InferError, match="exceeds the body size"):
        decode_request(body, str(len(body) + 1), 1 << 20)


@pytest.mark.parametrize("shape, fragment", [
    ([2**40, 2**40], "more than the"),  # wraps to 0 in int64: must not pass as an empty tensor
    ([2**62, 4], "more than the"),
    ([3, -2], "negative"),
    ([1, True], "list of integers"),
    ([1 << 11, 1 << 10], "more than the 1048576 allowed"),
])
def test_shapes_refused_before_allocation(shape, fragment):
    with pytest.raises(InferError, match=fragment) as err:
        codec.check_shape("x", shape, 1 << 20)
    assert err.value.kind == ErrorKind.INVALID_ARG
    header = json.dumps({"inputs": [{"name": "x", "shape": shape, "datatype": "FP32",
                                     "parameters": {"binary_data_size": 0}}]}).encode()
    with pytest.raises(InferError, match=fragment):
        decode_request(header, str(len(header)), 1 << 20)


def _traced_lines(fn, *args) -> tuple[int, object]:
    """Line events executed inside codec's BYTES decoder while running fn(*args)."""
    events = 0

    def tracer(frame, event, arg):
        nonlocal events
        if frame.f_code.co_name == "_bytes_from_raw":
            if event == "line":
                events += 1
            return tracer
        return None

    sys.settrace(tracer)
    try:
        try:
            return events, fn(*args)
        except InferError as exc:
            return events, exc
    finally:
        sys.settrace(None)


def test_bytes_decoding_work_is_bounded_by_the_declared_shape():
    hostile = struct.pack("<I", 0) * 100_000  # 100,000 empty elements for a shape of one
    events, outcome = _traced_lines(codec.from_raw, "s", "BYTES", (1,), hostile)
    assert events < 100, f"{events} Python lines ran for one declared element"
    assert isinstance(outcome, InferError) and "follow the 1 elements" in outcome.message
    events, outcome = _traced_lines(codec.from_raw, "s", "BYTES", (100_000,), b"\0" * 16)
    assert events < 100
    assert isinstance(outcome, InferError) and "needs 100000 BYTES elements" in outcome.message
    ok = codec.from_raw("s", "BYTES", (2,), struct.pack("<I", 1) + b"a" + struct.pack("<I", 0))
    assert ok.tolist() == [b"a", b""]


def test_grpc_typed_contents_counted_before_conversion():
    from tritonclient.grpc import service_pb2 as pb

    from gateway.kserve.grpc import infer as infer_grpc

    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype="INT32", shape=[2, 2])
    tensor.contents.int_contents.extend([1, 2, 3])
    with pytest.raises(InferError, match="got 3 elements, shape \\[2, 2\\] needs 4"):
        infer_grpc.decode_inputs(request, 1 << 20)
    tensor.contents.int_contents.append(4)
    assert infer_grpc.decode_inputs(request, 1 << 20)["x"].tolist() == [[1, 2], [3, 4]]
    request.raw_input_contents.append(np.zeros(4, np.int32).tobytes())
    with pytest.raises(InferError, match="not both"):
        infer_grpc.decode_inputs(request, 1 << 20)
    small = pb.ModelInferRequest(model_name="m")
    small.inputs.add(name="x", datatype="INT8", shape=[1]).contents.int_contents.append(300)
    with pytest.raises(InferError, match="cannot convert"):
        infer_grpc.decode_inputs(small, 1 << 20)
    huge = pb.ModelInferRequest(model_name="m")
    huge.inputs.add(name="x", datatype="FP32", shape=[2**40, 2**40])
    with pytest.raises(InferError, match="more than the"):
        infer_grpc.decode_inputs(huge, 1 << 20)


def test_request_limits_in_process():
    r = _req(x=np.zeros((4, 300, 2), np.float32))
    with pytest.raises(InferError, match="more than the 1000 allowed"):
        validate_request(CONFIG, r, 1000)
    r = _req(x=np.zeros((1, 1, 2), np.float32))
    r.timeout_us = 10**400
    with pytest.raises(InferError, match="'timeout'"):
        validate_request(CONFIG, r, 1000)
    r.timeout_us, r.priority = 0, 2  # the model has no priority levels: 0 or 1
    with pytest.raises(InferError, match="'priority'"):
        validate_request(CONFIG, r, 1000)
