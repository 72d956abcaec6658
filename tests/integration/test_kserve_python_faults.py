"""Python models that misbehave, in-process and with `isolation: process`, against a real `sluice serve`
(real tritonclient): SystemExit, KeyboardInterrupt, hangs past the time limit, os._exit and segfaults fail only
their own requests, the model keeps serving, and isolated results equal in-process ones bit for bit."""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.kserve_support import start_server, write_model

pytestmark = pytest.mark.integration

LIMIT_S = 2
FAULTY_PY = '''
import ctypes, json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils

W = np.random.default_rng(7).standard_normal((4, 3)).astype(np.float32)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            action = json.loads(request.parameters()).get("action", "")
            if action == "exit":
                raise SystemExit(3)
            if action == "interrupt":
                raise KeyboardInterrupt
            if action == "os_exit":
                os._exit(1)
            if action == "segfault":
                ctypes.string_at(0)
            if action == "hang":
                for _ in range(600):  # 60 s, far past the limit
                    time.sleep(0.1)
                open(os.path.join(os.path.dirname(__file__), "hang-ended"), "w").close()
            if action == "bls":
                pb_utils.InferenceRequest(model_name="faulty", requested_output_names=["Y"], inputs=[]).exec()
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            s = pb_utils.get_input_tensor_by_name(request, "S").as_numpy()
            y = np.tanh(x @ W) * np.float32(1.7) + np.sqrt(np.abs(x[:, :3]))
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", y.astype(np.float32)),
                pb_utils.Tensor("T", np.array([[b"<" + v + b">"] for v in s.reshape(-1)], dtype=object)),
                pb_utils.Tensor("PID", np.full((x.shape[0], 1), os.getpid(), dtype=np.int64))]))
        return responses
'''
CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "S" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 3 ] }}, {{ name: "T" data_type: TYPE_STRING dims: [ 1 ] }},
         {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
parameters {{ key: "execute_timeout_s" value {{ string_value: "{limit}" }} }}
{isolation}
'''
ISOLATED = 'parameters { key: "isolation" value { string_value: "process" } }'
MODELS = ["faulty_inproc", "faulty_isolated"]
RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def server():
    root = Path(tempfile.mkdtemp(prefix="sluice-faults-"))
    repo = root / "repo"
    write_model(repo, "faulty_inproc", CONFIG.format(name="faulty_inproc", limit=LIMIT_S, isolation=""), FAULTY_PY)
    write_model(repo, "faulty_isolated", CONFIG.format(name="faulty_isolated", limit=LIMIT_S, isolation=ISOLATED),
                FAULTY_PY)
    srv = start_server(root, repo)
    yield srv
    srv.stop()


def _inputs(x: np.ndarray, texts: list[bytes], binary: bool = True) -> list[httpclient.InferInput]:
    s = np.array([[t] for t in texts], dtype=object)
    a, b = httpclient.InferInput("X", list(x.shape), "FP32"), httpclient.InferInput("S", list(s.shape), "BYTES")
    a.set_data_from_numpy(x, binary_data=binary)
    b.set_data_from_numpy(s, binary_data=binary)
    return [a, b]


def _infer(server, model: str, action: str = "", x: np.ndarray | None = None) -> dict[str, np.ndarray]:
    x = np.ones((1, 4), np.float32) if x is None else x
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    try:
        result = client.infer(model, _inputs(x, [b"t"] * len(x)), parameters={"action": action} if action else None)
        return {n: result.as_numpy(n) for n in ("Y", "T", "PID")}
    finally:
        client.close()


def _failure(server, model: str, action: str) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        _infer(server, model, action)
    return err.value


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("action, raised", [("exit", "SystemExit: 3"), ("interrupt", "KeyboardInterrupt")])
def test_system_exit_and_keyboard_interrupt_fail_only_their_request(server, model, action, raised):
    pid = _infer(server, model)["PID"][0, 0]
    err = _failure(server, model, action)
    assert err.status() == "500" and raised in err.message()
    assert _infer(server, model)["PID"][0, 0] == pid  # served by the same instance, in the same process
    assert server.proc.poll() is None


@pytest.mark.parametrize("model", MODELS)
def test_hung_execute_fails_within_the_limit_and_the_next_request_is_served(server, model):
    pid = _infer(server, model)["PID"][0, 0]
    err = _failure(server, model, "hang")
    assert err.status() == "503" and f"time limit of {LIMIT_S} s" in err.message()
    # The hang marks its end: the request was failed at the limit, while the execute still hung.
    assert not (server.repo / model / "1" / "hang-ended").exists()
    after = _infer(server, model)
    assert after["Y"].shape == (1, 3)
    if model == "faulty_isolated":
        assert after["PID"][0, 0] != pid  # the hung process was killed and replaced


@pytest.mark.parametrize("action, how", [("os_exit", "exit code 1"), ("segfault", "killed by SIGSEGV")])
def test_isolated_crash_fails_only_that_batch_and_the_process_restarts(server, action, how):
    before = _infer(server, "faulty_isolated")["PID"][0, 0]
    with ThreadPoolExecutor(5) as pool:
        crash = pool.submit(_infer, server, "faulty_isolated", action)
        others = [pool.submit(_infer, server, "faulty_isolated", "", np.full((1, 4), i, np.float32))
                  for i in range(4)]
        with pytest.raises(InferenceServerException) as err:
            crash.result(timeout=120)
        results = [f.result(timeout=120) for f in others]  # the requests around the crash are all served
    assert err.value.status() == "500" and how in err.value.message()
    assert all(r["Y"].shape == (1, 3) for r in results)
    after = _infer(server, "faulty_isolated")
    assert after["PID"][0, 0] != before
    assert server.proc.poll() is None


def test_isolated_results_equal_in_process_results_bit_for_bit(server):
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    x[0, 0] = -0.0
    texts = [b"", b"caf\xc3\xa9", b"\0\xff", b"x" * 70_000, b"last"]
    http = httpclient.InferenceServerClient(server.http_url)
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        utf8 = [b"", b"caf\xc3\xa9", b"a b", b"x" * 70_000, b"last"]
        for binary, sent in ((True, texts), (False, utf8)):  # JSON carries only UTF-8 text
            got = [http.infer(m, _inputs(x, sent, binary),
                              outputs=[httpclient.InferRequestedOutput(n, binary_data=True) for n in ("Y", "T")])
                   for m in MODELS]
            assert got[0].as_numpy("Y").tobytes() == got[1].as_numpy("Y").tobytes()
            assert got[0].as_numpy("T").tolist() == got[1].as_numpy("T").tolist()
        s = np.array([[t] for t in texts], dtype=object)
        grpc_results = []
        for m in MODELS:
            a, b = grpcclient.InferInput("X", list(x.shape), "FP32"), grpcclient.InferInput("S", list(s.shape), "BYTES")
            a.set_data_from_numpy(x)
            b.set_data_from_numpy(s)
            grpc_results.append(grpc_client.infer(m, [a, b]))
        assert grpc_results[0].as_numpy("Y").tobytes() == grpc_results[1].as_numpy("Y").tobytes()
        assert grpc_results[1].as_numpy("T").ravel().tolist() == [b"<" + t + b">" for t in texts]
    finally:
        http.close()
        grpc_client.close()


def test_bls_from_an_isolated_model_is_refused_with_a_clear_error(server):
    err = _failure(server, "faulty_isolated", "bls")
    assert err.status() == "500" and "not supported in a model with isolation 'process'" in err.message()
    assert _infer(server, "faulty_isolated")["Y"].shape == (1, 3)
