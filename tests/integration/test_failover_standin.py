"""Failover before the first byte: a dead worker's requests move to the next-ranked one.

Workers are the TensorRT-LLM STAND-IN (tests/standins/trtllm_standin.py): this tests
the gateway's retry and the router's breaker, not TensorRT-LLM.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from engines.weights import resolve_llm
from tests.integration.vllm_support import free_port, stop_process, wait_healthy
from tests.servers import ROOT, Server, metric_value, start_server

pytestmark = pytest.mark.integration

STANDIN = ROOT / "tests" / "standins" / "trtllm_standin.py"
MODEL = "standin-model"


def _standin(model_dir: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    env = dict(os.environ, SLUICE_TRTLLM_SERVE=f"{sys.executable} {STANDIN} --token-delay-s 0.01")
    proc = subprocess.Popen(
        [sys.executable, "-m", "engines.launchers", "--engine", "trtllm", "--model", str(model_dir),
         "--served-model-name", MODEL, "--port", str(port)], cwd=ROOT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, timeout_s=60)
    return url, proc


@pytest.fixture()
def two_standins(tmp_path: Path) -> Iterator[tuple[Server, list[tuple[str, subprocess.Popen[bytes]]]]]:
    model_dir = resolve_llm("smollm2-135m-instruct", ROOT / "model_repository")
    workers = [_standin(model_dir), _standin(model_dir)]
    (tmp_path / "repo").mkdir()
    gateway = start_server(["--model-repository", str(tmp_path / "repo")], tmp_path / "gateway.log")
    try:
        for i, (url, _) in enumerate(workers):
            # Registration loads the tokenizer: longer than httpx's 5 s default on a busy machine.
            r = httpx.post(gateway.url + "/v1/admin/workers", timeout=60, json={
                "name": f"trt-{i}", "url": url, "engine": "trtllm", "models": [MODEL], "tokenizer": str(model_dir)})
            assert r.status_code == 201, r.text
        yield gateway, workers
    finally:
        gateway.stop()
        for _, proc in workers:
            stop_process(proc)


def test_requests_fail_over_to_the_live_worker(two_standins) -> None:
    gateway, workers = two_standins
    stop_process(workers[0][1])  # trt-0 dies; the gateway has not noticed yet
    sdk = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    served = []
    for i in range(4):  # round robin puts trt-0 first for half of them
        raw = sdk.with_options(default_headers={"X-Routing-Policy": "round_robin"}).completions.with_raw_response \
            .create(model=MODEL, prompt=list(range(10 + i, 40 + i)), max_tokens=3)
        assert raw.parse().choices[0].finish_reason == "length"
        served.append(raw.headers["x-sluice-worker"])
    assert served == ["trt-1"] * 4  # every request answered, by the worker that served it
    text = httpx.get(gateway.url + "/metrics").text
    assert (metric_value(text, "sluice_request_retries_total", {"model": MODEL}) or 0) >= 1  # it did fail over
    # The gauge is refreshed by the router's maintenance pass, so it may show the failed attempt a
    # moment longer (bounded wait); a request left counted on the dead worker never clears.
    for _ in range(50):
        in_flight = metric_value(text, "sluice_router_worker_in_flight", {"worker": "trt-0"}) or 0
        if in_flight == 0:
            break
        time.sleep(0.2)
        text = httpx.get(gateway.url + "/metrics").text
    assert in_flight == 0


def test_admin_routes_need_the_key_when_one_is_set(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    gateway = start_server(["--model-repository", str(tmp_path / "repo")], tmp_path / "gateway.log",
                           env={"SLUICE_ADMIN_KEY": "s3cret-key"})
    try:
        record = {"name": "x", "url": "http://127.0.0.1:9", "engine": "trtllm", "models": ["m"]}
        r = httpx.post(gateway.url + "/v1/admin/workers", json=record)
        assert r.status_code == 401 and "s3cret" not in r.text
        r = httpx.post(gateway.url + "/v1/admin/workers", json=record,
                       headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = httpx.get(gateway.url + "/v1/admin/workers", headers={"Authorization": "Bearer s3cret-key"})
        assert r.status_code == 200 and r.json()["data"] == []
        assert "s3cret" not in gateway.log()
    finally:
        gateway.stop()
