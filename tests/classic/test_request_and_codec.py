"""Request validation against a config, and the KServe tensor codec (raw, BYTES prefixes, JSON)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from engines.classic.errors import Code, InferError
from engines.classic.request import InferRequest, validate_request
from gateway.kserve import codec
from gateway.kserve.http_infer import decode_request, encode_response

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
    validate_request(CONFIG, r)
    assert r.batch_size == 3 and r.batch_key == (("x", (5, 2)),)


def test_strings_become_bytes():
    r = _req(x=np.zeros((1, 1, 2), np.float32), s=np.array([["hé"]]))
    validate_request(CONFIG, r)
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
        validate_request(CONFIG, _req(**inputs))
    assert err.value.kind == Code.INVALID_ARG and fragment in err.value.message


def test_unknown_output_requested():
    r = _req(x=np.zeros((1, 1, 2), np.float32))
    r.outputs = ["nope"]
    with pytest.raises(InferError, match="unexpected inference output"):
        validate_request(CONFIG, r)


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
    req = decode_request(body, str(len(header)))
    assert req.request_id == "7" and req.inputs["x"].tolist() == [[1.0, 2.0]] and req.binary_outputs == {"y"}
    out, length = encode_response("m", "1", req, {"y": np.array([[3, 4]], np.float32)})
    assert length is not None and out[length:] == np.array([3, 4], np.float32).tobytes()
    with pytest.raises(InferError, match="only 4 bytes"):
        decode_request(header + b"\0" * 4, str(len(header)))
    with pytest.raises(InferError, match="bytes of binary data follow"):
        decode_request(body + b"\0", str(len(header)))
    with pytest.raises(InferError, match="exceeds the body size"):
        decode_request(body, str(len(body) + 1))
