"""`sluice serve --frontends 2`: two real server processes on one set of ports, under their supervisor.

Every request opens a new connection, so the kernel spreads them over both frontends; what a
client reads back (Triton statistics over HTTP and gRPC, Prometheus metrics on both ports) must
add up over both. A frontend killed is restarted and serves again; SIGTERM ends them all; what
N copies cannot keep consistent is refused at start. LLM traffic across frontends (shared routing,
quotas and registrations): test_frontends_llm.py.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import ROOT, Server, free_port, llm_only_repository, start_server

pytestmark = pytest.mark.integration
MODEL = "digits_onnx"
ROW = [0.25] * 64


def _repo(tmp: Path) -> Path:
    repo = tmp / "repo"
    repo.mkdir()
    shutil.copytree(ROOT / "model_repository" / MODEL, repo / MODEL)
    return repo


def _frontends(server: Server) -> list[psutil.Process]:
    return psutil.Process(server.proc.pid).children()


def _http_infer(server: Server, n: int) -> None:
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": ROW}]}
    for _ in range(n):  # a new connection each time
        r = httpx.post(f"{server.url}/v2/models/{MODEL}/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text


def _grpc_infer(server: Server, n: int) -> np.ndarray:
    out = None
    for _ in range(n):
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        x = grpcclient.InferInput("input", [1, 64], "FP32")
        x.set_data_from_numpy(np.asarray([ROW], dtype=np.float32))
        out = client.infer(MODEL, [x]).as_numpy("probabilities")
        client.close()
    assert out is not None
    return out


def _per_frontend(text: str, name: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):  # the merged exposition must parse
        for sample in family.samples:
            if sample.name == name and sample.labels.get("model") == MODEL:
                values[sample.labels["frontend"]] = sample.value
    return values


def _wait_frontends_ready(server: Server, count: int, timeout_s: float = 60.0) -> list[psutil.Process]:
    """Until `count` frontends run and every one has answered (a metrics scrape names each)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs = _frontends(server)
        if len(procs) == count:
            _http_infer(server, 20)
            text = httpx.get(server.url + "/metrics", timeout=30).text
            if len(_per_frontend(text, "nv_inference_count")) == count:
                return procs
        time.sleep(0.5)
    raise AssertionError(f"{count} frontends did not come up:\n{server.log()[-3000:]}")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    metrics_port = free_port()
    s = start_server(["--model-repository", str(_repo(tmp_path)), "--frontends", "2",
                      "--metrics-port", str(metrics_port)], tmp_path / "sluice.log", grpc=True)
    s.metrics_port = metrics_port  # type: ignore[attr-defined]
    yield s
    s.stop()


def test_both_frontends_serve_and_report_as_one(server: Server) -> None:
    assert len(_frontends(server)) == 2
    _http_infer(server, 40)
    probabilities = _grpc_infer(server, 10)
    assert probabilities.shape == (1, 10) and abs(float(probabilities.sum()) - 1.0) < 1e-4

    stats = httpx.get(f"{server.url}/v2/models/{MODEL}/stats", timeout=30).json()["model_stats"][0]
    assert stats["inference_count"] == 50 and stats["inference_stats"]["success"]["count"] == 50
    assert sum(b["compute_infer"]["count"] for b in stats["batch_stats"]) == stats["execution_count"]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    assert client.get_inference_statistics(MODEL).model_stats[0].inference_count == 50
    all_stats = httpx.get(f"{server.url}/v2/models/stats", timeout=30).json()["model_stats"]
    assert [s["inference_count"] for s in all_stats if s["name"] == MODEL] == [50]

    for url in (server.url, f"http://127.0.0.1:{server.metrics_port}"):  # type: ignore[attr-defined]
        counts = _per_frontend(httpx.get(url + "/metrics", timeout=30).text, "nv_inference_count")
        assert set(counts) == {"0", "1"}, counts  # 2**-49 that 50 connections all reach one frontend
        assert all(v > 0 for v in counts.values()) and sum(counts.values()) == 50

    missing = httpx.get(f"{server.url}/v2/models/nope/stats", timeout=30)
    assert missing.status_code == 404 and "error" in missing.json()


def test_a_killed_frontend_is_restarted_and_the_others_serve_meanwhile(server: Server) -> None:
    victim, survivor = _frontends(server)
    victim.kill()
    victim.wait(10)
    _http_infer(server, 10)  # the survivor answers every one
    procs = _wait_frontends_ready(server, 2)
    assert victim.pid not in {p.pid for p in procs} and survivor.pid in {p.pid for p in procs}
    assert "exited with status -9; restarting it" in server.log()


def test_sigterm_ends_every_frontend(server: Server) -> None:
    procs = _frontends(server)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert not alive


def test_what_copies_cannot_keep_consistent_is_refused(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--model-repository", str(_repo(tmp_path)),
           "--http-port", str(free_port()), "--frontends", "2"]
    for extra, why in ((["--model-control-mode", "explicit"], "explicit model control"),
                       (["--frontends", "0"], "greater than or equal to 1")):
        done = subprocess.run(cmd + extra, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and why in done.stderr, done.stderr


def test_an_in_process_llm_is_refused_before_any_frontend_starts(tmp_path: Path) -> None:
    """Every frontend would load the weights: refused at once, before a model is loaded."""
    repo = llm_only_repository(tmp_path)
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--model-repository", str(repo),
           "--http-port", str(free_port()), "--grpc-port", "0", "--frontends", "2"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "would load its own copy of LLM(s) smollm2-135m-instruct" in done.stderr
    assert "frontend 0 started" not in done.stderr


def test_the_llm_check_in_each_frontend_backs_the_supervisors() -> None:
    """A repository that gained an LLM between the supervisor's check and a frontend's scan."""
    from types import SimpleNamespace

    from engines.errors import SluiceError
    from gateway.http.startup import _refuse_llms_in_frontends

    def state(frontends: int, served: tuple[str, ...]) -> Any:
        return SimpleNamespace(settings=SimpleNamespace(frontends=frontends, served_llms=served),
                               classic=SimpleNamespace(llm_model_configs=lambda: {"late-llm": object()}))
    with pytest.raises(SluiceError, match="would load its own copy of LLM"):
        _refuse_llms_in_frontends(state(2, ()))
    _refuse_llms_in_frontends(state(1, ()))  # a single server loads it, as always
    _refuse_llms_in_frontends(state(2, ("another",)))  # not one this server serves


SLOW_PY = '''
import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(120)  # loads for longer than any test waits

    def execute(self, requests):
        return []
'''
SLOW_CONFIG = '''
name: "slow"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''


def test_a_stop_while_the_frontends_load_ends_them_at_once(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    (repo / "slow" / "1" / "model.py").write_text(SLOW_PY)
    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--model-repository", str(repo),
           "--http-port", str(port), "--grpc-port", "0", "--frontends", "2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(psutil.Process(proc.pid).children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        frontends = psutil.Process(proc.pid).children()
        time.sleep(3)  # inside initialize() by now
        with pytest.raises(httpx.ConnectError):  # a frontend listens only once it is ready
            httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5)
        proc.send_signal(signal.SIGTERM)
        # The loads sleep 120 s: a stop that waited for them would not exit within this wait.
        assert proc.wait(60) == 0, proc.stdout.read() if proc.stdout else ""
        _, alive = psutil.wait_procs(frontends, timeout=10)
        assert not alive
    finally:
        if proc.poll() is None:
            proc.kill()


def test_frontends_die_with_their_supervisor(server: Server) -> None:
    frontends = _frontends(server)
    server.proc.kill()  # SIGKILL: nothing of the supervisor runs
    server.proc.wait(10)
    _, alive = psutil.wait_procs(frontends, timeout=30)
    assert not alive


def test_a_port_in_use_is_refused_before_any_frontend_starts(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--model-repository",
               str(_repo(tmp_path)), "--http-port", str(port), "--grpc-port", "0", "--frontends", "2"]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in done.stderr, done.stderr
