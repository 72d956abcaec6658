"""`sluice worker --engine vllm` on a real vLLM CPU worker (issue 22): a gateway that refuses the
registration leaves the engine serving, and SIGKILL on the launcher takes vLLM down with it, its
API server and engine-core processes both, so nothing orphaned holds the port (or, on a GPU node,
the GPU). The same faults on the trtllm stand-in: tests/engines/launchers/test_worker_lifecycle.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from tests.engines.launchers.test_worker_lifecycle import REGISTRATION_KEY, _attempts, _gateway
from tests.integration.vllm_support import (
    ROOT,
    free_port_pair,
    stop_process,
    tiny_llama_dir,
    vllm_env,
    wait_healthy,
)
from tests.servers import until

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def test_a_refused_vllm_worker_keeps_serving_and_dies_with_its_launcher(tmp_path: Path) -> None:
    gateway = _gateway(tmp_path, "gateway")
    port, kv_port = free_port_pair(), free_port_pair()
    env = vllm_env(PYTHONUNBUFFERED="1", SLUICE_REGISTRATION_KEY="not-" + REGISTRATION_KEY)
    argv = [sys.executable, "-m", "engines.launchers", "--engine", "vllm", "--model", str(tiny_llama_dir()),
            "--served-model-name", "tiny", "--port", str(port), "--kv-events-port", str(kv_port),
            "--max-model-len", "512", "--gateway", gateway.url, "--name", "refused-vllm"]
    log = tmp_path / "launcher.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    vllm: list[psutil.Process] = []
    try:
        wait_healthy(url, proc)
        engine = psutil.Process(proc.pid).children()
        assert len(engine) == 1, engine
        vllm += [engine[0], *engine[0].children(recursive=True)]  # the API server and its engine core
        until(lambda: _attempts(log) >= 1 or proc.poll() is not None, "a refused attempt, or the launcher's exit",
              timeout_s=120)
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        reply = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 2},
                           timeout=120)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        until(lambda: all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in vllm),
              "every vLLM process exited after the launcher was killed", timeout_s=180)
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=5)
    finally:
        stop_process(proc)
        for p in vllm:  # a failed run must not leave vLLM behind for the next test
            try:
                p.kill()
            except psutil.Error:
                pass
        gateway.stop()
