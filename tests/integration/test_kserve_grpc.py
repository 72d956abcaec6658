"""KServe v2 over gRPC against a real `sluice serve`, with the real tritonclient.grpc."""

from __future__ import annotations

import json
import queue
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from sklearn.datasets import load_digits
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.integration.kserve_support import shared_server, wait_for

pytestmark = pytest.mark.integration

DIGITS = load_digits()
X = (DIGITS.data / 16.0).astype(np.float32)


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.fixture()
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def _digits(x: np.ndarray) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return [inp]


def test_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata().name == "sluice"
    assert client.is_model_ready("digits_onnx") and not client.is_model_ready("missing_file")
    meta = client.get_model_metadata("digits_onnx", as_json=True)
    assert meta["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": ["-1", "64"]}
    config = client.get_model_config("digits_onnx").config
    assert config.max_batch_size == 64 and list(config.input[0].dims) == [64]


def test_infer_raw_contents(client):
    result = client.infer("digits_onnx", _digits(X[:8]),
                          outputs=[grpcclient.InferRequestedOutput("label"),
                                   grpcclient.InferRequestedOutput("probabilities")])
    assert result.as_numpy("label").ravel().tolist() == DIGITS.target[:8].tolist()
    assert result.as_numpy("probabilities").shape == (8, 10)


def test_ensemble_and_bytes_outputs(client):
    images = (DIGITS.images[:3] * 16).clip(0, 255).astype(np.uint8)
    inp = grpcclient.InferInput("IMAGE", list(images.shape), "UINT8")
    inp.set_data_from_numpy(images)
    result = client.infer("digits_ensemble", [inp])
    assert result.as_numpy("LABEL").ravel().tolist() == [b"zero", b"one", b"two"]
    stats = client.get_inference_statistics("digits_ensemble", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) >= 3


def test_python_model_as_triton_documents(client):
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([4, 3, 2, 1], dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    assert result.as_numpy("OUTPUT0").tolist() == [5, 5, 5, 5]
    assert result.as_numpy("OUTPUT1").tolist() == [-3, -1, 1, 3]


def test_stream_infer(client):
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for i in range(4):
            client.async_stream_infer("digits_onnx", _digits(X[i:i + 1]), request_id=str(i))
        client.async_stream_infer("no_such_model", _digits(X[:1]), request_id="bad")
        got = [results.get(timeout=60) for _ in range(5)]
    finally:
        client.stop_stream()
    ok = {r.get_response().id: int(r.as_numpy("label")[0, 0]) for r, e in got if e is None}
    assert ok == {str(i): int(DIGITS.target[i]) for i in range(4)}
    errors = [e for _, e in got if e is not None]
    assert len(errors) == 1 and "unknown model" in errors[0].message()


def test_batching_over_grpc(server, client):
    before = client.get_inference_statistics("digits_batched", as_json=True)["model_stats"][0]
    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(lambda i: client.infer("digits_batched", _digits(X[i:i + 1])).as_numpy("label"),
                             range(16)))
    after = client.get_inference_statistics("digits_batched", as_json=True)["model_stats"][0]
    inferences = int(after["inference_count"]) - int(before.get("inference_count", 0))
    executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
    assert inferences == 16 and executions < inferences
    assert [int(o[0, 0]) for o in outs] == DIGITS.target[:16].tolist()


def _gated(client, model, value, **kwargs):
    inp = grpcclient.InferInput("IN", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return client.infer(model, [inp], **kwargs).as_numpy("OUT")


def test_full_queue_unavailable_and_timeout(server, client):
    import httpx

    def pending() -> int:
        for line in httpx.get(f"http://{server.http_url}/metrics").text.splitlines():
            if line.startswith('nv_inference_pending_request_count{model="gated_queue"'):
                return int(float(line.rsplit(" ", 1)[1]))
        return 0

    gate = server.gate("gated_queue")
    (gate / "closed").touch()
    pool = ThreadPoolExecutor(4)
    try:
        started = len(list(gate.glob("started-*")))
        running = pool.submit(_gated, client, "gated_queue", 1.0)
        wait_for(lambda: len(list(gate.glob("started-*"))) > started and pending() == 1, "execution to start")
        with pytest.raises(InferenceServerException) as err:
            _gated(client, "gated_queue", 9.0, timeout=50_000)  # per-request timeout, microseconds
        assert err.value.status() == "StatusCode.UNAVAILABLE" and "timeout" in err.value.message().lower()
        assert not running.done()
        queued = [pool.submit(_gated, client, "gated_queue", v) for v in (2.0, 3.0)]
        wait_for(lambda: pending() == 3, "two queued requests")
        with pytest.raises(InferenceServerException) as err:
            _gated(client, "gated_queue", 4.0)
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        assert "Exceeds maximum queue size" in err.value.message()
    finally:
        (gate / "closed").unlink()
    assert running.result().tolist() == [[1.0]]
    assert sorted(f.result()[0, 0] for f in queued) == [2.0, 3.0]
    pool.shutdown()


def test_bad_inputs(server, client):
    bad_shape = grpcclient.InferInput("input", [1, 65], "FP32")
    bad_shape.set_data_from_numpy(np.zeros((1, 65), dtype=np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("digits_onnx", [bad_shape])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and "unexpected shape" in err.value.message()

    bad_type = grpcclient.InferInput("input", [1, 64], "INT32")
    bad_type.set_data_from_numpy(np.zeros((1, 64), dtype=np.int32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("digits_onnx", [bad_type])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"

    # A raw payload shorter than its shape, sent with the generated stub (the client would not build it).
    request = service_pb2.ModelInferRequest(model_name="digits_onnx")
    request.inputs.add(name="input", datatype="FP32", shape=[2, 64])
    request.raw_input_contents.append(X[:1].tobytes())  # half the bytes the shape needs
    with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as rpc_err:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert rpc_err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "binary data size" in rpc_err.value.details()

    with pytest.raises(InferenceServerException) as err:
        client.infer("digits_onnx", _digits(X[:1]), model_version="9")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as err:
        client.infer("nope", _digits(X[:1]))
    assert err.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as err:
        client.infer("bad_dtype", _digits(X[:1]))
    assert err.value.status() == "StatusCode.UNAVAILABLE" and "TYPE_FOO" in err.value.message()
    assert client.infer("digits_onnx", _digits(X[:1])).as_numpy("label")[0, 0] == DIGITS.target[0]


def test_repository_over_grpc(server, client):
    index = client.get_model_repository_index(as_json=True)["models"]
    states = {(m["name"], m.get("version", "")): m["state"] for m in index}
    assert states[("digits_onnx", "1")] == "READY" and states[("broken_config", "")] == "UNAVAILABLE"
    client.unload_model("digits_unbatched")
    assert not client.is_model_ready("digits_unbatched")
    with pytest.raises(InferenceServerException) as err:
        client.infer("digits_unbatched", _digits(X[:1]))
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    client.load_model("digits_unbatched")
    assert client.is_model_ready("digits_unbatched")
    config = json.loads(json.dumps(client.get_model_config("digits_unbatched", as_json=True)["config"]))
    config["max_batch_size"] = 32
    client.load_model("digits_unbatched", config=json.dumps(config))
    assert client.get_model_config("digits_unbatched").config.max_batch_size == 32
    with pytest.raises(InferenceServerException) as err:  # uploads are off on this server
        client.load_model("digits_unbatched", config=json.dumps(config), files={"file:1/model.onnx": b"x"})
    assert err.value.status() == "StatusCode.PERMISSION_DENIED"
    assert client.is_model_ready("digits_unbatched")
