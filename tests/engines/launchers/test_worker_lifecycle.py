"""`sluice worker`'s engine outlives registration faults and dies with its launcher (issue 22), on the
trtllm-serve STAND-IN started through the real launcher (TensorRT-LLM needs an NVIDIA GPU; the same
launcher code runs vLLM, checked on real vLLM in tests/integration/test_worker_launcher_vllm.py)
and real gateways under uvicorn.

- A gateway that refuses the registration (a wrong key) no longer costs the engine its life: the
  launcher keeps it serving and retries with back-off (it used to kill it and exit 1).
- A gateway that is not up yet gets the worker once it is, and one that restarted without shared
  state (so forgot the worker) gets it again.
- A launcher killed with SIGKILL takes its engine down (it used to leave it running, orphaned,
  holding its port).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from engines.weights import resolve_llm
from tests.integration.vllm_support import free_port, stop_process, wait_healthy
from tests.servers import Server, start_server, until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
STANDIN = ROOT / "tests" / "standins" / "trtllm_standin.py"
REGISTRATION_KEY = "lifecycle-registration-key-0123456789"


def _launch(gateway: str | None, name: str, log: Path, key: str = REGISTRATION_KEY,
            check_s: float = 30.0) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    model_dir = resolve_llm("smollm2-135m-instruct", ROOT / "model_repository")
    env = dict(os.environ, SLUICE_TRTLLM_SERVE=f"{sys.executable} {STANDIN}", SLUICE_REGISTRATION_KEY=key,
               PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "engines.launchers", "--engine", "trtllm", "--model", str(model_dir),
            "--served-model-name", "lifecycle-model", "--port", str(port), "--max-model-len", "1024",
            "--name", name, "--registration-check-s", str(check_s)]
    if gateway:
        argv += ["--gateway", gateway]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, timeout_s=120)
    return proc, url


def _gateway(tmp: Path, name: str, port: int | None = None) -> Server:
    repo = tmp / "repo"
    repo.mkdir(exist_ok=True)
    keys = {"SLUICE_REGISTRATION_KEY": REGISTRATION_KEY, "SLUICE_ADMIN_KEY": "lifecycle-admin-0123456789"}
    return start_server(["--model-repository", str(repo)], tmp / f"{name}.log", http_port=port, env=keys)


def _listed(gateway: Server, name: str) -> bool:
    try:
        rows = httpx.get(gateway.url + "/v1/admin/workers", timeout=10,
                         headers={"authorization": f"Bearer {REGISTRATION_KEY}"}).json()["data"]
    except (httpx.HTTPError, KeyError, ValueError):
        return False
    return any(row["name"] == name for row in rows)


def _attempts(log: Path) -> int:
    return log.read_text(errors="replace").count("the engine keeps serving")


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        stop_process(proc)


def test_a_refused_registration_leaves_the_engine_serving(tmp_path: Path, procs: list) -> None:
    gateway = _gateway(tmp_path, "gateway")
    try:
        proc, url = _launch(gateway.url, "refused", tmp_path / "launcher.log", key="not-the-registration-key-0000")
        procs.append(proc)
        until(lambda: _attempts(tmp_path / "launcher.log") >= 2 or proc.poll() is not None,
          "two refused attempts, or the launcher's exit", timeout_s=120)
        assert proc.poll() is None, (tmp_path / "launcher.log").read_text()[-2000:]
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        assert not _listed(gateway, "refused")
        log = (tmp_path / "launcher.log").read_text()
        assert "HTTP 401" in log and "not-the-registration-key" not in log  # the key is never echoed
    finally:
        gateway.stop()


def test_a_late_or_restarted_gateway_gets_the_worker(tmp_path: Path, procs: list) -> None:
    port = free_port()
    proc, _ = _launch(f"http://127.0.0.1:{port}", "late", tmp_path / "launcher.log", check_s=0.5)
    procs.append(proc)
    until(lambda: _attempts(tmp_path / "launcher.log") >= 1, "a failed attempt while no gateway listens", timeout_s=120)
    first = _gateway(tmp_path, "first", port)
    try:
        until(lambda: _listed(first, "late"), "registered with the gateway that came up late", timeout_s=120)
    finally:
        first.stop()
    second = _gateway(tmp_path, "second", port)  # same address, no shared state: it knows no workers
    try:
        until(lambda: _listed(second, "late"), "registered again with the restarted gateway", timeout_s=120)
        assert proc.poll() is None
    finally:
        second.stop()


def test_a_killed_launcher_takes_its_engine_down(tmp_path: Path, procs: list) -> None:
    proc, url = _launch(None, "orphan", tmp_path / "launcher.log")
    procs.append(proc)
    engine = psutil.Process(proc.pid).children()
    assert len(engine) == 1, engine
    os.kill(proc.pid, signal.SIGKILL)  # the launcher alone: no chance to stop its engine
    proc.wait()
    until(lambda: not engine[0].is_running() or engine[0].status() == psutil.STATUS_ZOMBIE,
          "the engine exited after its launcher was killed", timeout_s=120)
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=5)
