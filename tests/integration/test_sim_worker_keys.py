"""The SIM worker (`sluice worker --engine sim`) binds its --host alone and requires its worker key,
as the vLLM workers do (tests/integration/vllm_pair/test_worker_security_vllm.py); and a worker with no key
refuses to start on an address other machines can reach."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from engines.base import EngineError, EngineRequest, SamplingParams
from engines.errors import ErrorKind
from engines.remote import RemoteEngine, RemoteEngineConfig
from tests.integration.conftest import MODEL
from tests.integration.vllm_support import ROOT, free_port_pair, stop_process, tiny_llama_dir, wait_healthy

pytestmark = pytest.mark.integration

KEY = secrets.token_hex(24)


def _sim(*extra: str, env: dict[str, str] | None = None, capture: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim", "--model",
                             str(tiny_llama_dir()), "--served-model-name", MODEL, "--profile", "base_s=0.001", *extra],
                            cwd=ROOT, env={**os.environ, **(env or {})}, start_new_session=True,
                            stdout=subprocess.PIPE if capture else None, stderr=subprocess.STDOUT if capture else None)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, subprocess.Popen[bytes]]]:
    key_file = tmp_path_factory.mktemp("sim-key") / "worker.key"
    key_file.write_text(KEY + "\n")
    port, kv_port = free_port_pair(), free_port_pair()
    proc = _sim("--port", str(port), "--kv-events-port", str(kv_port), "--worker-key-file", str(key_file))
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        yield f"http://127.0.0.1:{port}", kv_port, proc
    finally:
        stop_process(proc)


def test_the_sim_binds_loopback_only(sim: tuple[str, int, subprocess.Popen[bytes]]) -> None:
    url, kv_port, proc = sim
    listening = {(c.laddr.ip, c.laddr.port) for c in psutil.Process(proc.pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN}
    port = int(url.rsplit(":", 1)[1])
    assert listening == {("127.0.0.1", port), ("127.0.0.1", kv_port), ("127.0.0.1", kv_port + 1)}


def test_the_sim_needs_its_key_except_on_the_probes(sim: tuple[str, int, subprocess.Popen[bytes]]) -> None:
    url = sim[0]
    body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 1}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}):
        refused = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=30)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_worker_key"
        assert refused.headers["www-authenticate"] == "Bearer" and KEY not in refused.text
    assert httpx.get(url + "/kv_event_sources", timeout=30).status_code == 401
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    assert httpx.get(url + "/metrics", timeout=30).status_code == 200
    ok = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1


def test_no_key_on_a_reachable_host_refuses_to_start(tmp_path: Path) -> None:
    port = free_port_pair()
    refused = _sim("--host", "192.0.2.10", "--port", str(port), env={"SLUICE_WORKER_KEY": ""}, capture=True)
    out, _ = refused.communicate(timeout=120)
    assert refused.returncode == 2, out
    assert b"--host 192.0.2.10 lets other machines reach this worker" in out
    assert b"--allow-unauthenticated" in out


async def test_a_refused_worker_key_is_named_not_passed_on_as_the_clients_401(
        sim: tuple[str, int, subprocess.Popen[bytes]]) -> None:
    engine = RemoteEngine(RemoteEngineConfig(sim[0], name="sim-keyed", api_key="a-wrong-worker-key-0123"))
    await engine.start()
    try:
        request = EngineRequest(request_id="r1", model=MODEL, prompt_token_ids=[1, 2, 3],
                                sampling=SamplingParams(max_tokens=1))
        with pytest.raises(EngineError) as refused:
            [d async for d in engine.generate(request)]
    finally:
        await engine.stop()
    assert refused.value.kind is ErrorKind.UNAVAILABLE and refused.value.retryable
    assert refused.value.code == "worker_key_refused"
    assert "worker sim-keyed refused the gateway's worker key (HTTP 401)" in refused.value.message
