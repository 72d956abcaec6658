"""Server-wide bounds against a real `sluice serve` started with small limits: the classic queue bound,
gRPC message size, concurrent RPCs and requests in flight on one ModelStreamInfer stream."""

from __future__ import annotations

import queue
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.kserve_support import (
    ECHO_CONFIG,
    ECHO_PY,
    GATED_CONFIG,
    GATED_PY,
    start_server,
    wait_for,
    write_model,
)

pytestmark = pytest.mark.integration

QUEUE_BOUND = 8
STREAM_INFLIGHT = 3
MAX_RPCS = 4
MAX_MESSAGE = 1 << 20


@pytest.fixture(scope="module")
def server():
    root = Path(tempfile.mkdtemp(prefix="sluice-limits-"))
    repo = root / "repo"
    gate = root / "gate_gated"
    gate.mkdir()
    # No queue policy in the config: the server's --classic-max-queue-size bounds it.
    write_model(repo, "gated", GATED_CONFIG.format(name="gated", policy="", gate=gate), GATED_PY)
    write_model(repo, "echo", ECHO_CONFIG, ECHO_PY)
    srv = start_server(root, repo, "--classic-max-queue-size", str(QUEUE_BOUND), "--grpc-max-stream-inflight",
                       str(STREAM_INFLIGHT), "--grpc-max-concurrent-rpcs", str(MAX_RPCS),
                       "--grpc-max-message-bytes", str(MAX_MESSAGE))
    yield srv
    srv.stop()


@pytest.fixture()
def gate(server):
    """The gated model's gate, closed for the test and opened (releasing every request) after it."""
    path = server.gate("gated")
    (path / "closed").touch()
    yield path
    (path / "closed").unlink(missing_ok=True)


def _pending(server) -> int:
    for line in httpx.get(f"http://{server.http_url}/metrics").text.splitlines():
        if line.startswith('nv_inference_pending_request_count{model="gated"'):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def _http_gated(url: str, value: float) -> np.ndarray:
    c = httpclient.InferenceServerClient(url, network_timeout=120)
    try:
        inp = httpclient.InferInput("IN", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[value]], dtype=np.float32))
        return c.infer("gated", [inp]).as_numpy("OUT")
    finally:
        c.close()


def _grpc_gated(value: float) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("IN", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return [inp]


def test_flood_beyond_the_queue_bound_gets_503_and_the_queue_stays_bounded(server, gate):
    started = len(list(gate.glob("started-*")))
    flood_size = 60
    with ThreadPoolExecutor(flood_size + 1) as pool:
        try:
            first = pool.submit(_http_gated, server.http_url, -1.0)
            wait_for(lambda: len(list(gate.glob("started-*"))) > started, "the first request to start executing")
            flood = [pool.submit(_http_gated, server.http_url, float(i)) for i in range(flood_size)]
            expected_refusals = flood_size - QUEUE_BOUND
            wait_for(lambda: sum(f.done() for f in flood) == expected_refusals, "the refusals")
            assert _pending(server) == QUEUE_BOUND + 1  # the executing request and a full queue, no more
            refused = [f for f in flood if f.done()]
            for f in refused:
                with pytest.raises(InferenceServerException) as err:
                    f.result()
                assert err.value.status() == "503" and "Exceeds maximum queue size" in err.value.message()
        finally:
            (gate / "closed").unlink(missing_ok=True)  # never leave the pool's threads blocked on the gate
        assert first.result(timeout=120).tolist() == [[-1.0]]
        served = [f.result(timeout=120)[0, 0] for f in flood if f not in refused]
    assert len(served) == QUEUE_BOUND
    assert _pending(server) == 0


def test_stream_reads_at_most_its_inflight_bound(server, gate):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        started = len(list(gate.glob("started-*")))
        for i in range(10):
            client.async_stream_infer("gated", _grpc_gated(float(i)), request_id=str(i))
        wait_for(lambda: len(list(gate.glob("started-*"))) > started and _pending(server) == STREAM_INFLIGHT,
                 "the stream's first requests to reach the model")
        # The queue would take eight more; the stream holds the rest back instead of reading them.
        assert _pending(server) == STREAM_INFLIGHT and results.empty()
        (gate / "closed").unlink()
        got = [results.get(timeout=120) for _ in range(10)]
    finally:
        (gate / "closed").unlink(missing_ok=True)
        client.stop_stream()
        client.close()
    assert all(e is None for _, e in got), [e for _, e in got if e is not None]
    assert sorted(r.get_response().id for r, _ in got) == sorted(str(i) for i in range(10))


def _echo_input() -> grpcclient.InferInput:
    inp = grpcclient.InferInput("X", [1, 4], "FP32")
    inp.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    return inp


def test_concurrent_rpcs_beyond_the_bound_get_resource_exhausted(server, gate):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    try:
        started = len(list(gate.glob("started-*")))
        for i in range(MAX_RPCS):
            client.async_infer("gated", _grpc_gated(float(i)), lambda result, error: results.put((result, error)))
        wait_for(lambda: len(list(gate.glob("started-*"))) > started and _pending(server) == MAX_RPCS,
                 "the RPCs to be in progress")
        with pytest.raises(InferenceServerException) as err:
            client.infer("echo", [_echo_input()])
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED" and "RPCs in progress" in err.value.message()
        assert client.is_server_live() and client.is_server_ready()  # probes hold no slot and are not counted
        (gate / "closed").unlink()
        got = [results.get(timeout=120) for _ in range(MAX_RPCS)]
        assert all(e is None for _, e in got)
        assert client.is_server_live()
    finally:
        (gate / "closed").unlink(missing_ok=True)
        client.close()


def test_grpc_message_over_the_bound_is_refused_and_the_server_serves(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        big = np.zeros((1, MAX_MESSAGE // 4 + 1024), dtype=np.float32)  # a little over 1 MiB
        inp = grpcclient.InferInput("X", list(big.shape), "FP32")
        inp.set_data_from_numpy(big)
        with pytest.raises(InferenceServerException) as err:
            client.infer("echo", [inp])
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        small = np.arange(16, dtype=np.float32).reshape(1, 16)
        inp = grpcclient.InferInput("X", list(small.shape), "FP32")
        inp.set_data_from_numpy(small)
        with pytest.raises(InferenceServerException) as err:  # a small tensor, but a request over the bound
            client.infer("echo", [inp], parameters={"padding": "x" * (MAX_MESSAGE + 1024)})
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert client.infer("echo", [inp]).as_numpy("Y").tolist() == small.tolist()
    finally:
        client.close()
