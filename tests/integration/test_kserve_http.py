"""KServe v2 over HTTP against a real `sluice serve`, with the real tritonclient.http (JSON and binary)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from sklearn.datasets import load_digits
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
    c = httpclient.InferenceServerClient(server.http_url, concurrency=16)
    yield c
    c.close()


def _digits_inputs(x: np.ndarray, binary: bool) -> list[httpclient.InferInput]:
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    return [inp]


def _outputs(binary: bool, *names: str) -> list[httpclient.InferRequestedOutput]:
    return [httpclient.InferRequestedOutput(n, binary_data=binary) for n in names]


def test_server_endpoints(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "sluice" and "binary_tensor_data" in meta["extensions"]


def test_model_metadata_config_ready(client):
    assert client.is_model_ready("digits_onnx")
    assert client.is_model_ready("digits_onnx", "1")
    assert not client.is_model_ready("digits_onnx", "7")
    assert not client.is_model_ready("broken_config")
    meta = client.get_model_metadata("digits_onnx")
    assert meta["platform"] == "onnxruntime" or meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert {o["name"] for o in meta["outputs"]} == {"label", "probabilities"}
    config = client.get_model_config("digits_onnx")
    assert config["max_batch_size"] == 64 and config["input"][0]["dims"] == [64]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000


@pytest.mark.parametrize("binary", [False, True])
def test_infer_digits_json_and_binary(client, binary):
    result = client.infer("digits_onnx", _digits_inputs(X[:10], binary),
                          outputs=_outputs(binary, "label", "probabilities"))
    assert result.as_numpy("label").ravel().tolist() == DIGITS.target[:10].tolist()
    probs = result.as_numpy("probabilities")
    assert probs.shape == (10, 10) and probs.dtype == np.float32
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-4)


def test_default_outputs_binary_and_json_equal(client):
    binary = client.infer("digits_onnx", _digits_inputs(X[:4], True))  # client asks binary_data_output
    json_res = client.infer("digits_onnx", _digits_inputs(X[:4], False), outputs=_outputs(False, "probabilities"))
    assert np.allclose(binary.as_numpy("probabilities"), json_res.as_numpy("probabilities"), atol=1e-6)


def test_breast_cancer(client):
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x = data.data[:20].astype(np.float32)
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    labels = client.infer("breast_cancer_gb", [inp]).as_numpy("label").ravel()
    assert (labels == data.target[:20]).mean() >= 0.9


@pytest.mark.parametrize("binary", [False, True])
def test_ensemble_raw_pixels_to_names(client, binary):
    images = (DIGITS.images[:6] * 16).clip(0, 255).astype(np.uint8)
    inp = httpclient.InferInput("IMAGE", list(images.shape), "UINT8")
    inp.set_data_from_numpy(images, binary_data=binary)
    result = client.infer("digits_ensemble", [inp], outputs=_outputs(binary, "LABEL", "SCORE"))
    names = ["zero", "one", "two", "three", "four", "five"]
    assert [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("LABEL").ravel()] == names
    assert result.as_numpy("SCORE").shape == (6, 1)


@pytest.mark.parametrize("binary", [False, True])
def test_python_model_as_triton_documents(client, binary):
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([10, 20, 30, 40], dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    result = client.infer("add_sub", inputs, outputs=_outputs(binary, "OUTPUT0", "OUTPUT1"))
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()


@pytest.mark.parametrize("model", ["bls_sync", "bls_async"])
def test_bls(client, model):
    inp = httpclient.InferInput("PIXELS", [3, 64], "FP32")
    inp.set_data_from_numpy(X[20:23])
    assert client.infer(model, [inp]).as_numpy("LABEL").ravel().tolist() == DIGITS.target[20:23].tolist()


def test_numpy_api_and_torchscript(client):
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    inp = httpclient.InferInput("X", [2, 3], "INT32")
    inp.set_data_from_numpy(x)
    assert client.infer("numpy_double", [inp]).as_numpy("Y").tolist() == (x * 2).tolist()
    t = np.array([[1, 2, 3]], dtype=np.float32)
    tin = httpclient.InferInput("INPUT__0", [1, 3], "FP32")
    tin.set_data_from_numpy(t)
    assert client.infer("torch_affine", [tin]).as_numpy("OUTPUT__0").tolist() == (t * 3 + 1).tolist()


def test_versions(client):
    meta = client.get_model_metadata("digits_versions")
    assert meta["versions"] == ["1", "3"]
    result = client.infer("digits_versions", _digits_inputs(X[:1], True), model_version="3")
    assert result.get_response()["model_version"] == "3"
    with pytest.raises(InferenceServerException) as err:
        client.infer("digits_versions", _digits_inputs(X[:1], True), model_version="2")
    assert err.value.status() == "404" and "version 2" in err.value.message()


def _stats(client, model: str) -> dict:
    return client.get_inference_statistics(model)["model_stats"][0]


def test_batching_proof_and_equal_results(client):
    before = _stats(client, "digits_batched")
    # tritonclient.http's gevent pool sends these concurrently from one client.
    pending = [client.async_infer("digits_batched", _digits_inputs(X[i:i + 1], True)) for i in range(16)]
    results = [p.get_result().as_numpy("probabilities") for p in pending]
    after = _stats(client, "digits_batched")
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 16
    assert executions < inferences, after
    assert any(b["batch_size"] > 1 for b in after["batch_stats"])
    unbatched = [client.infer("digits_unbatched", _digits_inputs(X[i:i + 1], True)).as_numpy("probabilities")
                 for i in range(16)]
    assert np.allclose(np.concatenate(results), np.concatenate(unbatched), atol=1e-6)
    assert after["inference_stats"]["success"]["count"] >= 16
    assert after["inference_stats"]["queue"]["ns"] > 0


def _gated_infer(client, model: str, value: float, **kwargs):
    """One blocking call; `client` may be a URL, so that each thread uses its own (gevent) client."""
    own = isinstance(client, str)
    c = httpclient.InferenceServerClient(client) if own else client
    try:
        inp = httpclient.InferInput("IN", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[value]], dtype=np.float32))
        return c.infer(model, [inp], **kwargs).as_numpy("OUT")
    finally:
        if own:
            c.close()


def _pending(server, model: str) -> int:
    text = httpx.get(f"http://{server.http_url}/metrics").text
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def test_full_queue_answers_503(server, client):
    gate = server.gate("gated_queue")
    (gate / "closed").touch()
    pool = ThreadPoolExecutor(4)
    try:
        running = pool.submit(_gated_infer, server.http_url, "gated_queue", 1.0)
        wait_for(lambda: any(gate.glob("started-*")), "the first request to start executing")
        queued = [pool.submit(_gated_infer, server.http_url, "gated_queue", v) for v in (2.0, 3.0)]
        wait_for(lambda: _pending(server, "gated_queue") == 3, "two queued requests")
        with pytest.raises(InferenceServerException) as err:
            _gated_infer(client, "gated_queue", 4.0)
        assert err.value.status() == "503"
        assert "Exceeds maximum queue size" in err.value.message()
    finally:
        (gate / "closed").unlink()
    assert running.result().tolist() == [[1.0]]
    assert [f.result().tolist() for f in queued] == [[[2.0]], [[3.0]]]
    pool.shutdown()


def test_timeout_rejected_while_model_busy(server, client):
    gate = server.gate("gated_timeout")
    (gate / "closed").touch()
    pool = ThreadPoolExecutor(2)
    try:
        running = pool.submit(_gated_infer, server.http_url, "gated_timeout", 1.0)
        wait_for(lambda: any(gate.glob("started-*")), "the first request to start executing")
        with pytest.raises(InferenceServerException) as err:
            _gated_infer(client, "gated_timeout", 2.0)  # default_timeout_microseconds: 200000, REJECT
        assert err.value.status() == "503" and "timeout" in err.value.message().lower()
        assert not running.done()  # the model was still busy when the timeout fired
    finally:
        (gate / "closed").unlink()
    assert running.result().tolist() == [[1.0]]
    pool.shutdown()


def test_per_request_timeout_parameter(server, client):
    gate = server.gate("gated_queue")
    (gate / "closed").touch()
    pool = ThreadPoolExecutor(2)
    try:
        running = pool.submit(_gated_infer, server.http_url, "gated_queue", 1.0)
        wait_for(lambda: len(list(gate.glob("started-*"))) >= 1 and _pending(server, "gated_queue") == 1,
                 "the request to start executing")
        with pytest.raises(InferenceServerException) as err:
            _gated_infer(client, "gated_queue", 2.0, timeout=50_000)
        assert err.value.status() == "503" and "timeout" in err.value.message().lower()
    finally:
        (gate / "closed").unlink()
    assert running.result().tolist() == [[1.0]]
    pool.shutdown()


def _raw_infer(server, body: bytes, headers: dict | None = None, model: str = "digits_onnx") -> httpx.Response:
    return httpx.post(f"http://{server.http_url}/v2/models/{model}/infer", content=body, headers=headers or {})


def test_bad_inputs_get_clear_errors(server, client):
    wrong_shape = httpclient.InferInput("input", [1, 63], "FP32")
    wrong_shape.set_data_from_numpy(np.zeros((1, 63), dtype=np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("digits_onnx", [wrong_shape])
    assert err.value.status() == "400" and "unexpected shape" in err.value.message()

    wrong_dtype = httpclient.InferInput("input", [1, 64], "FP64")
    wrong_dtype.set_data_from_numpy(np.zeros((1, 64), dtype=np.float64))
    with pytest.raises(InferenceServerException) as err:
        client.infer("digits_onnx", [wrong_dtype])
    assert err.value.status() == "400" and "data-type" in err.value.message()

    with pytest.raises(InferenceServerException) as err:
        client.infer("no_such_model", _digits_inputs(X[:1], True))
    assert err.value.status() == "404" and "unknown model" in err.value.message()

    with pytest.raises(InferenceServerException) as err:
        client.infer("broken_config", _digits_inputs(X[:1], True))
    assert err.value.status() == "503" and "config.pbtxt" in err.value.message()

    header = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 256}}]}).encode()
    short = _raw_infer(server, header + b"\0" * 100, {"Inference-Header-Content-Length": str(len(header))})
    assert short.status_code == 400 and "binary" in short.json()["error"]

    ragged = json.dumps({"inputs": [{"name": "input", "shape": [2, 2], "datatype": "FP32",
                                     "data": [[1, 2], [3]]}]}).encode()
    assert _raw_infer(server, ragged).status_code == 400
    assert _raw_infer(server, b"{not json").json()["error"].startswith("failed to parse")
    # ... and the server keeps serving.
    assert client.infer("digits_onnx", _digits_inputs(X[:1], True)).as_numpy("label")[0, 0] == DIGITS.target[0]


def test_stats_and_metrics(server, client):
    client.infer("digits_onnx", _digits_inputs(X[:2], True))
    all_stats = client.get_inference_statistics()["model_stats"]
    assert {"digits_onnx", "digits_ensemble"} <= {s["name"] for s in all_stats}
    text = httpx.get(f"http://{server.http_url}/metrics").text
    for family in ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                   "nv_inference_exec_count", "nv_inference_pending_request_count",
                   "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                   "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                   "nv_inference_compute_output_duration_us"):
        assert f'{family}{{model="digits_onnx",version="1"}}' in text or family == "nv_inference_request_failure"
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):  # Triton's reasons, as Triton labels failures
        assert f'nv_inference_request_failure{{model="digits_onnx",reason="{reason}",version="1"}}' in text


def test_repository_index_load_unload(server, client):
    index = {(m["name"], m.get("version", "")): m for m in client.get_model_repository_index()}
    assert index[("digits_onnx", "1")]["state"] == "READY"
    assert index[("broken_config", "")]["state"] == "UNAVAILABLE"
    assert "broken_config/config.pbtxt" in index[("broken_config", "")]["reason"]

    client.unload_model("numpy_double")
    assert not client.is_model_ready("numpy_double")
    client.load_model("numpy_double")
    assert client.is_model_ready("numpy_double")

    # Override config: the same model with a different max_batch_size.
    config = client.get_model_config("numpy_double")
    config["max_batch_size"] = 4
    client.load_model("numpy_double", config=json.dumps(config))
    assert client.get_model_config("numpy_double")["max_batch_size"] == 4

    # Without --allow-model-uploads, file: parameters (code run at load) are refused and nothing is written.
    model_py = b"class SluiceModel:\n    def execute_batch(self, inputs):\n        return {'Y': inputs['X'] + 1}\n"
    with pytest.raises(InferenceServerException) as err:
        client.load_model("numpy_double", config=json.dumps(config), files={"file:2/model.py": model_py})
    assert err.value.status() == "403" and "--allow-model-uploads" in err.value.message()
    assert not (server.repo / "numpy_double" / "2").exists()
    assert sorted(p.name for p in server.repo.iterdir() if p.name.startswith(".")) == []
    inp = httpclient.InferInput("X", [1, 2], "INT32")
    inp.set_data_from_numpy(np.array([[1, 2]], dtype=np.int32))
    assert client.infer("numpy_double", [inp]).as_numpy("Y").tolist() == [[2, 4]]

    with pytest.raises(InferenceServerException) as err:
        client.load_model("numpy_double", config="{bad json")
    assert err.value.status() == "400"
    assert client.is_model_ready("numpy_double")  # a failed reload leaves the served model alone


def test_load_reports_bad_model_and_server_keeps_serving(server, client):
    with pytest.raises(InferenceServerException) as err:
        client.load_model("bad_dims")
    assert "dims[0]" in err.value.message() and "bad_dims/config.pbtxt" in err.value.message()
    resp = httpx.post(f"http://{server.http_url}/v2/repository/models/numpy_double/load",
                      json={"parameters": {"file:1/x.py": "***not base64***"}})
    assert resp.status_code == 400 and "error" in resp.json()
    assert client.is_server_ready()


def test_embedding_model_over_kserve(client):
    texts = np.array([[b"A cat sits on the mat."], [b"A kitten is sitting on a rug."],
                      [b"Quarterly revenue grew by ten percent."]], dtype=object)
    inp = httpclient.InferInput("TEXT", [3, 1], "BYTES")
    inp.set_data_from_numpy(texts)
    emb = client.infer("all-minilm-l6-v2", [inp]).as_numpy("EMBEDDING")
    assert emb.shape == (3, 384) and emb.dtype == np.float32
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-4)
    assert emb[0] @ emb[1] > emb[0] @ emb[2] + 0.2  # similar sentences are closer
    single = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    single.set_data_from_numpy(texts[:1])
    alone = client.infer("all-minilm-l6-v2", [single]).as_numpy("EMBEDDING")
    assert np.allclose(alone[0], emb[0], atol=1e-4)  # padding in a batch does not change a row
