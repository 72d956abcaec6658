"""`sluice worker --engine transformers` as a separate process behind a gateway:
the worker contract (OpenAI HTTP, /health, /metrics), registration and deregistration, and its
worker key (every route but the probes needs it; the gateway sends it)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.servers import LLM_NAME, ROOT, Server, free_port, start_server, wait_healthy

pytestmark = pytest.mark.integration

WORKER_KEY = secrets.token_hex(24)


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway with an empty repository: its only LLM will be the registered worker."""
    tmp = tmp_path_factory.mktemp("front")
    (tmp / "empty-repo").mkdir()
    server = start_server(["--model-repository", str(tmp / "empty-repo")], tmp / "gateway.log",
                          env={"SLUICE_WORKER_KEY": WORKER_KEY})
    yield server
    server.stop()


def _models(server: Server) -> list[str]:
    return [m["id"] for m in httpx.get(server.url + "/v1/models").json()["data"]]


def _no_worker_answers(front: Server, sdk: openai.OpenAI) -> None:
    """With its only worker drained, a model has no worker: 503 in each protocol, with a
    message and no stack trace; undraining serves again."""
    assert httpx.post(f"{front.url}/v1/admin/workers/tf-worker-a/drain").status_code == 200
    try:
        r = httpx.post(f"{front.url}/v2/models/{LLM_NAME}/generate", json={"text_input": "Hi"})
        assert r.status_code == 503, r.text
        assert "worker" in r.json()["error"] and "Traceback" not in r.text
        with pytest.raises(openai.InternalServerError) as err:
            sdk.chat.completions.create(model=LLM_NAME, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
        assert err.value.status_code == 503 and err.value.body["code"] == "no_worker"
    finally:
        httpx.post(f"{front.url}/v1/admin/workers/tf-worker-a/drain?undo=1")
    r = httpx.post(f"{front.url}/v2/models/{LLM_NAME}/generate", timeout=120,
                   json={"text_input": "The capital of France is", "parameters": {"max_tokens": 4}})
    assert r.status_code == 200, r.text


def test_worker_registers_serves_and_deregisters(front: Server, tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "worker", "--engine", "transformers", "--model", LLM_NAME,
         "--host", "127.0.0.1", "--port", str(port), "--gateway", front.url, "--name", "tf-worker-a"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "SLUICE_WORKER_KEY": WORKER_KEY})
    worker = Server(proc, port, 0, tmp_path / "worker.log")
    try:
        wait_healthy(worker, 240)
        own = httpx.get(worker.url + "/metrics")  # its own Prometheus endpoint, not vLLM's
        assert own.status_code == 200 and "sluice_engine_requests_running" in own.text
        assert "vllm:" not in own.text
        assert httpx.get(worker.url + "/v1/models").status_code == 401  # its key guards what is not a probe
        keyed = httpx.get(worker.url + "/v1/models", headers={"Authorization": f"Bearer {WORKER_KEY}"})
        assert keyed.status_code == 200
        for _ in range(100):  # registration follows readiness
            if LLM_NAME in _models(front):
                break
            time.sleep(0.2)
        assert _models(front) == [LLM_NAME]
        sdk = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        raw = sdk.chat.completions.with_raw_response.create(
            model=LLM_NAME, temperature=0, max_tokens=24,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert raw.headers["x-sluice-worker"] == "tf-worker-a"
        answer = raw.parse()
        # Once in a clean-clone CI run this answer was empty, finish "stop", and never seen since;
        # the whole answer and the worker's log say what happened if it comes back.
        assert "Paris" in (answer.choices[0].message.content or ""), (answer.model_dump(), worker.log()[-3000:])
        _no_worker_answers(front, sdk)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        assert _models(front) == []
    finally:
        worker.stop()
