"""The gateway in front of a TensorRT-LLM STAND-IN, listed in a --workers-file.

TensorRT-LLM needs an NVIDIA GPU, which these machines lack. The worker here is
`tests/standins/trtllm_standin.py`, started by the real launcher; it reproduces
trtllm-serve's HTTP shapes (strict request fields, flat errors, /kv_cache_events).
Nothing here verifies TensorRT-LLM itself.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import yaml

from engines.weights import resolve_llm
from tests.integration.vllm_support import free_port, stop_process, wait_healthy
from tests.servers import ROOT, Server, metric_value, start_server

pytestmark = pytest.mark.integration

STANDIN = ROOT / "tests" / "standins" / "trtllm_standin.py"
MODEL = "standin-model"
# Below the 2,048 tokens the gateway assumes for a worker whose /v1/models has no max_model_len,
# so that a refusal for length comes from the worker and is relayed, not made by the gateway.
WORKER_CONTEXT = 1024
WORKER_KEY = secrets.token_hex(24)
# Two API keys, two tenants: vLLM would get each its own cache_salt; trtllm-serve takes none.
KEY_A, KEY_B = f"sk-a-{secrets.token_hex(12)}", f"sk-b-{secrets.token_hex(12)}"


@pytest.fixture(scope="module")
def standin_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("trt")
    model_dir = resolve_llm("smollm2-135m-instruct", ROOT / "model_repository")  # its tokenizer
    port = free_port()
    # With a worker key on both sides: the gateway's requests, health checks and event polls all carry it.
    env = dict(os.environ, SLUICE_TRTLLM_SERVE=f"{sys.executable} {STANDIN} --token-delay-s 0.01",
               SLUICE_WORKER_KEY=WORKER_KEY)
    proc = subprocess.Popen(
        [sys.executable, "-m", "engines.launchers", "--engine", "trtllm", "--model", str(model_dir),
         "--served-model-name", MODEL, "--port", str(port), "--max-model-len", str(WORKER_CONTEXT)],
        cwd=ROOT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    gateway = None
    try:
        wait_healthy(url, proc, timeout_s=60)
        workers_file = tmp / "workers.yaml"
        workers_file.write_text(yaml.safe_dump([{
            "name": "trt-0", "url": url, "engine": "trtllm", "block_size": 32, "models": [MODEL],
            "kv_events_endpoint": f"{url}/kv_cache_events", "tokenizer": str(model_dir)}]))
        (tmp / "repo").mkdir()
        assert httpx.post(f"{url}/kv_cache_events", timeout=10).status_code == 401  # the key guards the events
        gateway = start_server(["--model-repository", str(tmp / "repo"), "--workers-file", str(workers_file)],
                               tmp / "gateway.log",
                               env={"SLUICE_WORKER_KEY": WORKER_KEY, "SLUICE_API_KEYS": f"{KEY_A},{KEY_B}"})
        yield gateway
    finally:
        if gateway is not None:
            gateway.stop()
        stop_process(proc)


def sdk(server: Server, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_standin_chat_streams_through_the_gateway(standin_gateway: Server) -> None:
    raw = sdk(standin_gateway).chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=6, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Hello"}],
        extra_body={"ignore_eos": True})  # a vLLM extra trtllm-serve also takes
    assert raw.headers["x-sluice-worker"] == "trt-0"
    chunks = list(raw.parse())
    # The stand-in renders no chat template, so only the completion count is meaningful
    # here; prompt-token parity is tested against real vLLM workers.
    assert chunks[-1].usage.completion_tokens == 6
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _kv_events(gateway: Server) -> float:
    text = httpx.get(gateway.url + "/metrics").text
    return metric_value(text, "sluice_router_kv_events_total", {"worker": "trt-0"}) or 0


def test_standin_cached_tokens_and_kv_events_reach_the_gateway(standin_gateway: Server) -> None:
    before = _kv_events(standin_gateway)  # the module's other tests share this gateway
    ids = list(range(300, 400))  # 3 full blocks of 32
    c = sdk(standin_gateway)
    c.completions.create(model=MODEL, prompt=ids, max_tokens=2)
    second = c.completions.create(model=MODEL, prompt=ids, max_tokens=2)
    assert second.usage.prompt_tokens_details.cached_tokens == 96
    grown = 0.0
    for _ in range(100):  # the router polls /kv_cache_events
        grown = _kv_events(standin_gateway) - before
        if grown > 0:
            break
        time.sleep(0.1)
    assert grown > 0


def test_standin_refusal_is_relayed_as_an_openai_error(standin_gateway: Server) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        sdk(standin_gateway).completions.create(model=MODEL, prompt=list(range(10)), max_tokens=1500)
    assert e.value.status_code == 400
    error = e.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert f"max_seq_len {WORKER_CONTEXT}" in error["message"]  # the worker's own words


def test_standin_shared_cache_is_predicted_for_every_tenant(standin_gateway: Server) -> None:
    """trtllm-serve is sent no cache_salt, so its prefix cache is shared by the tenants and its KV
    events are unsalted: the router must predict it on the unsalted chain for a keyed request, or
    X-Sluice-Predicted-Cached-Tokens would read 0 where the engine serves the prefix from cache."""
    ids = list(range(500, 600))  # 3 full blocks of 32, a prompt no other test sends
    sdk(standin_gateway, KEY_A).completions.create(model=MODEL, prompt=ids, max_tokens=2)
    raw = sdk(standin_gateway, KEY_B).completions.with_raw_response.create(model=MODEL, prompt=ids, max_tokens=2)
    assert raw.parse().usage.prompt_tokens_details.cached_tokens == 96  # the engine's cache is shared
    assert raw.headers["x-sluice-predicted-cached-tokens"] == "96"
