"""Gateway readiness when one model loses its last worker (issue 22), on real gateways under uvicorn
and two SIM workers (one model each), over the real admin API.

A model served by workers is down on every gateway replica alike, so by default it no longer takes
the replica out of service: `/health` stays 200 and counts it under `details.models.unavailable`,
`sluice_model_ready{model}` names it, and its requests get 503 with Retry-After while the other
model goes on serving. With `--strict-readiness` (Triton's rule) `/health` turns 503.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import yaml

from tests.integration.vllm_support import ROOT, free_port_pair, stop_process, tiny_llama_dir, wait_healthy
from tests.servers import Server, metric_value, start_server

pytestmark = pytest.mark.integration

UP, DOWN = "ready-model", "lost-model"


@dataclass
class Gateways:
    lenient: Server
    strict: Server


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
    tmp = tmp_path_factory.mktemp("readiness")
    (tmp / "repo").mkdir()
    model_dir = tiny_llama_dir()
    ports = {UP: free_port_pair(), DOWN: free_port_pair()}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim", "--model", str(model_dir),
         "--served-model-name", model, "--port", str(port), "--no-kv-events", "--profile", "base_s=0.001"],
        cwd=ROOT, start_new_session=True) for model, port in ports.items()]
    servers: list[Server] = []
    try:
        for proc, port in zip(procs, ports.values(), strict=True):
            wait_healthy(f"http://127.0.0.1:{port}", proc)
        workers = tmp / "workers.yaml"
        workers.write_text(yaml.safe_dump([
            {"name": model, "url": f"http://127.0.0.1:{port}", "engine": "sim", "models": [model],
             "tokenizer": str(model_dir)} for model, port in ports.items()]))
        args = ["--model-repository", str(tmp / "repo"), "--workers-file", str(workers)]
        for name, extra in (("lenient", []), ("strict", ["--strict-readiness"])):
            servers.append(start_server(args + extra, tmp / f"{name}.log"))
        for server in servers:  # the last worker of DOWN's model leaves it (drained: no new requests)
            assert httpx.post(f"{server.url}/v1/admin/workers/{DOWN}/drain", timeout=10).status_code == 200
        yield Gateways(*servers)
    finally:
        for server in servers:
            server.stop()
        for proc in procs:
            stop_process(proc)


def _chat(server: Server, model: str) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", timeout=60,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def test_a_model_without_workers_leaves_the_replica_ready_and_says_so(gateways: Gateways) -> None:
    health = httpx.get(gateways.lenient.url + "/health", timeout=10)
    assert health.status_code == 200, health.text
    assert health.json()["details"]["models"] == {"ready": 1, "unavailable": 1}
    assert DOWN not in health.text  # model names are not on the open probe; the metric has them
    metrics = httpx.get(gateways.lenient.url + "/metrics", timeout=10).text
    assert metric_value(metrics, "sluice_model_ready", {"model": UP}) == 1
    assert metric_value(metrics, "sluice_model_ready", {"model": DOWN}) == 0
    assert _chat(gateways.lenient, UP).status_code == 200
    lost = _chat(gateways.lenient, DOWN)
    assert lost.status_code == 503 and "retry-after" in lost.headers, lost.text
    assert lost.json()["error"]["type"] == "server_error"


def test_strict_readiness_takes_the_replica_out(gateways: Gateways) -> None:
    health = httpx.get(gateways.strict.url + "/health", timeout=10)
    assert health.status_code == 503 and health.json()["detail"] == "a model cannot serve", health.text
    assert health.json()["details"]["models"] == {"ready": 1, "unavailable": 1}
    undo = httpx.post(f"{gateways.strict.url}/v1/admin/workers/{DOWN}/drain?undo=1", timeout=10)
    assert undo.status_code == 200
    try:
        assert httpx.get(gateways.strict.url + "/health", timeout=10).status_code == 200
    finally:
        httpx.post(f"{gateways.strict.url}/v1/admin/workers/{DOWN}/drain", timeout=10)
