"""Hostile KServe requests against the shared real server (HTTP and gRPC, real tritonclient): each is refused
with the right status, and the server keeps serving."""

from __future__ import annotations

import gzip
import json
import zlib
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.integration.kserve_support import shared_server, wait_for

pytestmark = pytest.mark.integration

X = np.linspace(0, 1, 64, dtype=np.float32).reshape(1, 64)
BAD_NAMES = ["a..b", "..", "x\0y", "back\\slash", ".hidden", "-dash", "a" * 129]


def _in_path(name: str) -> str:
    """The name as one URL path segment (clients would resolve a bare '..' away before sending it)."""
    return "".join(f"%{ord(c):02X}" if c in "\0." else c for c in name)


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.fixture()
def http(server):
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


@pytest.fixture()
def grpc_client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def _digits_http(x: np.ndarray = X) -> list[httpclient.InferInput]:
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return [inp]


def _digits_grpc(x: np.ndarray = X) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return [inp]


def _still_serves(http, grpc_client) -> None:
    assert http.infer("digits_onnx", _digits_http()).as_numpy("label").shape == (1, 1)
    assert grpc_client.infer("digits_onnx", _digits_grpc()).as_numpy("label").shape == (1, 1)


def _gated(url: str, model: str, value: float, **kwargs) -> np.ndarray:
    c = httpclient.InferenceServerClient(url)
    try:
        inp = httpclient.InferInput("IN", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[value]], dtype=np.float32))
        return c.infer(model, [inp], **kwargs).as_numpy("OUT")
    finally:
        c.close()


def _pending(server, model: str) -> int:
    for line in httpx.get(f"http://{server.http_url}/metrics").text.splitlines():
        if line.startswith(f'nv_inference_pending_request_count{{model="{model}"'):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


@pytest.mark.parametrize("route", ["", "/ready", "/config", "/stats"])
@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_model_names_on_http_model_routes(server, route, name):
    resp = httpx.get(f"http://{server.http_url}/v2/models/{_in_path(name)}{route}")
    assert resp.status_code == 400, (name, route, resp.text)
    assert "invalid model name" in resp.json()["error"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_model_names_on_http_infer_load_unload(server, name):
    base = f"http://{server.http_url}"
    path = _in_path(name)
    for url, body in ((f"{base}/v2/models/{path}/infer", {"inputs": []}),
                      (f"{base}/v2/models/{path}/generate", {"text_input": "hi"}),
                      (f"{base}/v2/repository/models/{path}/load", {}),
                      (f"{base}/v2/repository/models/{path}/unload", {})):
        resp = httpx.post(url, json=body)
        assert resp.status_code == 400 and "invalid model name" in resp.json()["error"], (url, resp.text)


@pytest.mark.parametrize("name", ["../digits_onnx", "/etc/passwd", "a/b", "a..b", "x\0y", ""])
def test_bad_model_names_over_grpc(server, name):
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        calls = [
            (stub.ModelReady, service_pb2.ModelReadyRequest(name=name)),
            (stub.ModelMetadata, service_pb2.ModelMetadataRequest(name=name)),
            (stub.ModelConfig, service_pb2.ModelConfigRequest(name=name)),
            (stub.ModelInfer, service_pb2.ModelInferRequest(model_name=name)),
            (stub.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(model_name=name)),
            (stub.RepositoryModelUnload, service_pb2.RepositoryModelUnloadRequest(model_name=name)),
        ]
        if name:
            calls.append((stub.ModelStatistics, service_pb2.ModelStatisticsRequest(name=name)))
        for method, request in calls:
            with pytest.raises(grpc.RpcError) as err:
                method(request)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err.value.details())
            assert "invalid model name" in err.value.details()


def test_huge_timeout_is_refused_and_the_busy_model_keeps_serving(server, http):
    # Before: a 10**400 µs timeout queued behind a busy instance overflowed the batcher's
    # float conversion, killed its task silently, and every later request to the model hung.
    gate = server.gate("gated_queue")
    (gate / "closed").touch()
    pool = ThreadPoolExecutor(2)
    try:
        started = len(list(gate.glob("started-*")))
        running = pool.submit(_gated, server.http_url, "gated_queue", 1.0)
        wait_for(lambda: len(list(gate.glob("started-*"))) > started, "the first request to start executing")
        for timeout in (10**400, 2**63, 3600 * 10**6 + 1):
            with pytest.raises(InferenceServerException) as err:
                _gated(server.http_url, "gated_queue", 2.0, timeout=timeout)
            assert err.value.status() == "400" and "'timeout'" in err.value.message()
        with pytest.raises(InferenceServerException) as err:
            _gated(server.http_url, "gated_queue", 2.0, priority=2)  # the model has one priority level
        assert err.value.status() == "400" and "'priority'" in err.value.message()
        queued = pool.submit(_gated, server.http_url, "gated_queue", 3.0, timeout=3600 * 10**6)
        wait_for(lambda: _pending(server, "gated_queue") == 2, "the long-timeout request to queue")
    finally:
        (gate / "closed").unlink()
    assert running.result(timeout=60).tolist() == [[1.0]]
    assert queued.result(timeout=60).tolist() == [[3.0]]
    assert _gated(server.http_url, "gated_queue", 4.0).tolist() == [[4.0]]
    pool.shutdown()


def test_timeout_and_priority_bounds_over_grpc(grpc_client):
    for kwargs, word in (({"timeout": 2**63 - 1}, "'timeout'"), ({"priority": 2**63}, "'priority'")):
        with pytest.raises(InferenceServerException) as err:
            grpc_client.infer("digits_onnx", _digits_grpc(), **kwargs)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and word in err.value.message()
    assert grpc_client.infer("digits_onnx", _digits_grpc(), timeout=10**6, priority=1).as_numpy("label").size == 1


@pytest.mark.parametrize("shape, fragment", [([2**40, 2**40], "more than the"), ([1, -64], "negative"),
                                             ([8192, 8192 + 1], "more than the 67108864 allowed")])
def test_oversized_shapes_refused_before_allocation(server, http, grpc_client, shape, fragment):
    body = json.dumps({"inputs": [{"name": "input", "shape": shape, "datatype": "FP32",
                                   "parameters": {"binary_data_size": 0}}]}).encode()
    resp = httpx.post(f"http://{server.http_url}/v2/models/digits_onnx/infer", content=body,
                      headers={"Inference-Header-Content-Length": str(len(body))})
    assert resp.status_code == 400 and fragment in resp.json()["error"]
    request = service_pb2.ModelInferRequest(model_name="digits_onnx")
    request.inputs.add(name="input", datatype="FP32", shape=shape)
    request.raw_input_contents.append(b"")
    with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as err:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in err.value.details()
    _still_serves(http, grpc_client)


def test_typed_contents_checked_before_conversion(server, http, grpc_client):
    stub_calls = []
    short = service_pb2.ModelInferRequest(model_name="digits_onnx")
    short.inputs.add(name="input", datatype="FP32", shape=[1, 64]).contents.fp32_contents.extend([0.5] * 63)
    stub_calls.append((short, "got 63 elements"))
    # 300 does not fit UINT8: a client error, not a server failure.
    overflow = service_pb2.ModelInferRequest(model_name="digits_preprocess")
    overflow.inputs.add(name="IMAGE", datatype="UINT8", shape=[1, 8, 8]).contents.uint_contents.extend([300] * 64)
    stub_calls.append((overflow, "cannot convert contents to UINT8"))
    both = service_pb2.ModelInferRequest(model_name="digits_onnx")
    both.inputs.add(name="input", datatype="FP32", shape=[1, 64]).contents.fp32_contents.extend([0.5] * 64)
    both.raw_input_contents.append(X.tobytes())
    stub_calls.append((both, "not both"))
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for request, fragment in stub_calls:
            with pytest.raises(grpc.RpcError) as err:
                stub.ModelInfer(request)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in err.value.details()
    _still_serves(http, grpc_client)


def test_bytes_payload_longer_than_its_shape(server, http, grpc_client):
    raw = b"\0\0\0\0" * 1_000_000  # a million empty elements for a [1, 1] tensor
    header = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()
    resp = httpx.post(f"http://{server.http_url}/v2/models/all-minilm-l6-v2/infer", content=header + raw,
                      headers={"Inference-Header-Content-Length": str(len(header))})
    assert resp.status_code == 400 and "follow the 1 elements" in resp.json()["error"]
    _still_serves(http, grpc_client)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_bomb_answers_413(server, http, grpc_client, encoding):
    inflated = b" " * (64 * 1024 * 1024)  # 64 MiB of spaces compresses to a few tens of KiB
    body = gzip.compress(inflated) if encoding == "gzip" else zlib.compress(inflated)
    assert len(body) < 1024 * 1024
    resp = httpx.post(f"http://{server.http_url}/v2/models/digits_onnx/infer", content=body,
                      headers={"Content-Encoding": encoding})
    assert resp.status_code == 413 and "decompressed, exceeds the limit" in resp.json()["error"]
    small = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                    "data": X.ravel().tolist()}]}).encode()
    resp = httpx.post(f"http://{server.http_url}/v2/models/digits_onnx/infer", content=gzip.compress(small),
                      headers={"Content-Encoding": "gzip"})
    assert resp.status_code == 200, resp.text
    _still_serves(http, grpc_client)
