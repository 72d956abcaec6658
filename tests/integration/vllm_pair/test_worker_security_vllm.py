"""Workers listen narrowly and need their key: real vLLM CPU workers, started by the launcher with
its defaults (the session's `workers`: no --host given, a worker key from the environment).

- Every socket of the worker's process tree (HTTP, KV events, replay, vLLM's own) is bound to
  loopback; none to a wildcard.
- A request straight to the worker without its key is refused 401, on vLLM's OpenAI routes and on
  the ones vLLM's own --api-key leaves open (`/invocations` generates, `/tokenize` reads prompts);
  the probes (`/health`, `/metrics`) stay open. The key is on no command line.
- The gateway that has the key serves through the worker; one without it fails at start with an
  error naming the worker's refusal instead of waiting for the worker.
"""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.integration.conftest import MODEL, WORKER_KEY, Worker
from tests.servers import Server, llm_only_repository, start_server

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _bound(pid: int) -> set[tuple[str, int]]:
    """Every (address, port) the process tree listens on (TCP) or has bound (UDP)."""
    out = set()
    for proc in _tree(pid):
        try:
            conns = proc.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        out |= {(c.laddr.ip, c.laddr.port) for c in conns
                if c.laddr and (c.status == psutil.CONN_LISTEN or c.status == psutil.CONN_NONE)}
    return out


def _port(worker: Worker) -> int:
    return int(worker.url.rsplit(":", 1)[1])


def test_a_default_worker_binds_loopback_only(workers: list[Worker]) -> None:
    for worker in workers:
        bound = _bound(worker.proc.pid)
        assert not {ip for ip, _ in bound} & {"0.0.0.0", "::"}, bound
        assert all(ipaddress.ip_address(ip).is_loopback for ip, _ in bound), bound
        # HTTP, the KV-event publisher and its replay socket are among them, on the worker's own host.
        assert {("127.0.0.1", _port(worker)), ("127.0.0.1", worker.kv_port), ("127.0.0.1", worker.kv_port + 1)} <= bound


def test_a_request_straight_to_the_worker_needs_its_key(workers: list[Worker]) -> None:
    worker = workers[0]
    wrong = openai.OpenAI(base_url=worker.url + "/v1", api_key="not-the-worker-key", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.completions.create(model=MODEL, prompt="Refuse me", max_tokens=1)
    assert refused.value.status_code == 401
    body = {"model": MODEL, "prompt": "Refuse me too", "max_tokens": 1}
    for path in ("/v1/completions", "/v1/models", "/invocations", "/tokenize", "/kv_event_sources"):
        assert httpx.post(worker.url + path, json=body, timeout=60).status_code == 401, path
    for path in ("/health", "/metrics"):  # what probes and Prometheus read: no prompt data
        assert httpx.get(worker.url + path, timeout=60).status_code == 200, path
    right = openai.OpenAI(base_url=worker.url + "/v1", api_key=WORKER_KEY, max_retries=0, timeout=120)
    usage = right.completions.create(model=MODEL, prompt="Let me in", max_tokens=2).usage
    assert usage is not None and usage.completion_tokens == 2
    # vLLM gets the key from its environment, not from --api-key, which `ps` would show.
    assert not any(WORKER_KEY in " ".join(p.cmdline()) for p in _tree(worker.proc.pid))


def test_the_gateway_with_the_key_serves_through_the_worker(gateway: Server) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Through the gateway, with the key"}], max_tokens=3,
        extra_body={"ignore_eos": True})
    assert raw.headers["x-sluice-worker"].startswith("vllm-")
    usage = raw.parse().usage
    assert usage is not None and usage.completion_tokens == 3


def test_a_gateway_without_the_key_names_the_workers_refusal(workers: list[Worker], tmp_path: Path) -> None:
    worker = workers[0]
    gateway = start_server(["--model-repository", str(llm_only_repository(tmp_path)),
                            "--worker", f"{worker.name}={worker.url}"], tmp_path / "gateway.log",
                           env={"SLUICE_WORKER_KEY": ""}, wait=False)
    try:
        detail = ""
        for _ in range(240):  # bounded: the refusal comes on the first probe, not after the workers' start-up wait
            detail = httpx.get(gateway.url + "/health", timeout=10).json().get("detail", "")
            if "refused" in detail:
                break
            time.sleep(0.5)
        assert f"worker {worker.url} refused the gateway's worker key (HTTP 401" in detail, detail
        assert "SLUICE_WORKER_KEY" in detail
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
        assert failed.value.status_code >= 400
        assert WORKER_KEY not in gateway.log()
    finally:
        gateway.stop()
