"""RemoteEngine and the trtllm launcher against the trtllm-serve STAND-IN.

TensorRT-LLM itself has not run here (no NVIDIA GPU). The stand-in
(tests/standins/trtllm_standin.py) reproduces trtllm-serve's documented HTTP
shapes; it is started through the real launcher (`python -m engines.launchers
--engine trtllm`), so the generated YAML and command line are exercised too.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from engines.base import Delta, EngineError, EngineRequest, SamplingParams
from engines.errors import ErrorKind
from engines.launchers import trtllm
from engines.launchers.spec import WorkerSpec
from engines.remote import RemoteEngine, RemoteEngineConfig
from engines.weights import resolve_llm
from tests.integration.vllm_support import free_port, stop_process, wait_healthy
from tests.servers import Server, metric_value, start_server

ROOT = Path(__file__).resolve().parents[3]
STANDIN = ROOT / "tests" / "standins" / "trtllm_standin.py"


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real gateway (`sluice serve`, empty repository) that the launcher registers with."""
    tmp = tmp_path_factory.mktemp("gateway")
    (tmp / "repo").mkdir()
    server = start_server(["--model-repository", str(tmp / "repo")], tmp / "gateway.log")
    yield server
    server.stop()


def _registered(gateway: Server) -> dict[str, dict[str, object]]:
    rows = httpx.get(gateway.url + "/v1/admin/workers", timeout=10).json()["data"]
    return {row["name"]: row for row in rows}


def _wait_registered(gateway: Server, name: str, present: bool = True) -> None:
    """The launcher registers after its own health check; wait (bounded) for the gateway to say so."""
    for _ in range(200):
        if (name in _registered(gateway)) == present:
            return
        time.sleep(0.1)


@pytest.fixture(scope="module")
def standin_worker(admin, tmp_path_factory) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The launcher running the stand-in as its `trtllm-serve`, registered with the real gateway (`admin`)."""
    gateway = admin
    port = free_port()
    # A real model directory, so the gateway can load the tokenizer the registration names.
    model_dir = resolve_llm("smollm2-135m-instruct", ROOT / "model_repository")
    env = dict(os.environ, SLUICE_TRTLLM_SERVE=f"{sys.executable} {STANDIN} --token-delay-s 0.05")
    argv = [sys.executable, "-m", "engines.launchers", "--engine", "trtllm", "--model", str(model_dir),
            "--served-model-name", "standin-model", "--port", str(port), "--max-model-len", "1024",
            "--gateway", gateway.url, "--name", "trt-standin"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout_s=60)
        _wait_registered(admin, "trt-standin")
        yield url, proc
    finally:
        stop_process(proc)


@pytest.fixture
async def engine(standin_worker) -> RemoteEngine:
    url, _ = standin_worker
    eng = RemoteEngine(RemoteEngineConfig(url, name="trt-standin", dialect="trtllm", served_model="standin-model"))
    await eng.start()
    yield eng
    await eng.stop()


def _req(rid: str, ids: list[int], max_tokens: int = 4, **kw: object) -> EngineRequest:
    return EngineRequest(request_id=rid, model="standin-model", prompt_token_ids=ids,
                         sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0), **kw)  # type: ignore[arg-type]


async def _collect(engine: RemoteEngine, request: EngineRequest) -> list[Delta]:
    return [d async for d in engine.generate(request)]


def test_trtllm_yaml_and_command_line(tmp_path: Path) -> None:
    spec = WorkerSpec(engine="trtllm", model_path="/models/llama", served_model_name="llama", port=9100,
                      tensor_parallel_size=2, pipeline_parallel_size=2, max_model_len=4096,
                      engine_args=("--max_batch_size", "64"))
    options = yaml.safe_load(trtllm.write_options(spec, tmp_path).read_text())
    assert options["kv_cache_config"]["enable_block_reuse"] is True
    assert options["kv_cache_config"]["event_buffer_max_size"] > 0
    argv = trtllm.build_trtllm_argv(spec, tmp_path / "o.yaml")
    joined = " ".join(argv)
    assert "--tp_size 2" in joined and "--pp_size 2" in joined and "--max_seq_len 4096" in joined
    assert "--backend pytorch" in joined and f"--extra_llm_api_options {tmp_path / 'o.yaml'}" in joined
    assert argv[-2:] == ["--max_batch_size", "64"]
    with pytest.raises(ValueError):
        trtllm.llm_api_options(spec, event_buffer_max_size=0)


@pytest.mark.integration
def test_standin_launcher_registers_with_gateway(standin_worker, admin) -> None:
    url, _ = standin_worker
    row = _registered(admin)["trt-standin"]
    assert (row["url"], row["models"], row["engine"], row["block_size"]) == (url, ["standin-model"], "trtllm", 32)
    assert row["kv_events"] is True  # the gateway polls /kv_cache_events
    models = [m["id"] for m in httpx.get(admin.url + "/v1/models").json()["data"]]
    assert models == ["standin-model"]


@pytest.mark.integration
async def test_standin_completion_streams_and_reports_cached_tokens(engine: RemoteEngine) -> None:
    ids = list(range(100, 200))  # 3 full blocks of 32
    first = await _collect(engine, _req("c1", ids))
    assert "".join(d.text for d in first).startswith(" t")
    assert first[-1].finish_reason == "length" and first[-1].prompt_tokens == 100
    second = await _collect(engine, _req("c2", ids))
    assert second[-1].cached_tokens == 96 and second[-1].completion_tokens == 4


@pytest.mark.integration
async def test_standin_chat_streams(engine: RemoteEngine) -> None:
    chat = {"model": "x", "messages": [{"role": "user", "content": "hello"}]}
    deltas = await _collect(engine, _req("h1", [], kind="chat", chat_body=chat))
    assert len([d for d in deltas if d.text]) == 4 and deltas[-1].finish_reason == "length"


def _events_applied(gateway: Server) -> float:
    text = httpx.get(gateway.url + "/metrics", timeout=10).text
    return metric_value(text, "sluice_router_kv_events_total", {"worker": "trt-standin"}) or 0.0


@pytest.mark.integration
async def test_standin_kv_cache_events_carry_token_ids(engine: RemoteEngine, standin_worker, admin) -> None:
    """The registered gateway polls the stand-in's /kv_cache_events; the token ids in them
    let its router predict a prefix hit for a prompt it never routed itself."""
    before = _events_applied(admin)
    ids = list(range(500, 564))  # 2 new blocks of 32, sent straight to the worker
    await _collect(engine, _req("k1", ids))
    for _ in range(100):
        if _events_applied(admin) > before:
            break
        await asyncio.sleep(0.1)
    # One request only: a second one would also match the first one's speculative entries.
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(admin.url + "/v1/completions",
                              json={"model": "standin-model", "prompt": [*ids, 1, 2, 3], "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert r.headers["x-sluice-predicted-cached-tokens"] == "64"
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 64  # and the engine agrees


@pytest.mark.integration
async def test_standin_refusals_are_openai_errors(engine: RemoteEngine, standin_worker) -> None:
    url, _ = standin_worker
    with pytest.raises(EngineError) as too_long:
        await _collect(engine, _req("e1", [1] * 1000, max_tokens=100))
    assert (too_long.value.kind, too_long.value.retryable) == (ErrorKind.INVALID_ARG, False)
    # A vLLM-dialect client sends vLLM-only fields, which trtllm-serve's strict models refuse.
    vllm_style = RemoteEngine(RemoteEngineConfig(url, dialect="vllm"))
    await vllm_style.start()
    try:
        with pytest.raises(EngineError) as strict:
            await _collect(vllm_style, _req("e2", [1, 2]))
        assert strict.value.kind == ErrorKind.INVALID_ARG and "Extra inputs" in strict.value.message
    finally:
        await vllm_style.stop()


@pytest.mark.integration
async def test_standin_faults_before_and_after_first_byte(standin_worker) -> None:
    url, _ = standin_worker
    for fault, expect in (("html-500", "raise"), ("midstream-error", "error"), ("midstream-close", "error")):
        eng = RemoteEngine(RemoteEngineConfig(url, dialect="trtllm", headers=(("X-Standin-Fault", fault),)))
        await eng.start()
        try:
            if expect == "raise":
                with pytest.raises(EngineError) as err:
                    await _collect(eng, _req(f"f-{fault}", [1, 2]))
                assert err.value.retryable and err.value.kind == ErrorKind.INTERNAL
            else:
                deltas = await _collect(eng, _req(f"f-{fault}", [1, 2], max_tokens=6))
                assert deltas[0].text and deltas[-1].finish_reason == "error" and deltas[-1].error
        finally:
            await eng.stop()


async def _running(url: str) -> int:
    async with httpx.AsyncClient(timeout=60) as client:
        return (await client.get(f"{url}/metrics")).json()[0]["numActiveRequests"]


async def _wait_running(url: str, predicate, attempts: int = 100) -> int:
    value = await _running(url)
    for _ in range(attempts):
        if predicate(value):
            return value
        await asyncio.sleep(0.1)
        value = await _running(url)
    return value


@pytest.mark.integration
async def test_standin_cancel_and_abort_close_the_upstream_request(engine: RemoteEngine, standin_worker) -> None:
    url, _ = standin_worker
    got_first = asyncio.Event()

    async def consume(rid: str) -> list[Delta]:
        out = []
        async for delta in engine.generate(_req(rid, [3, 4], max_tokens=500)):
            out.append(delta)
            got_first.set()
        return out

    task = asyncio.create_task(consume("cancel-me"))
    await got_first.wait()
    assert await _wait_running(url, lambda n: n >= 1) >= 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _wait_running(url, lambda n: n == 0) == 0

    got_first.clear()
    task = asyncio.create_task(consume("abort-me"))
    await got_first.wait()
    await engine.abort("abort-me")
    deltas = await task
    assert deltas[-1].finish_reason == "abort" and len(deltas) < 500
    assert await _wait_running(url, lambda n: n == 0) == 0
    assert engine.stats().running == 0


@pytest.mark.integration
def test_standin_launcher_sigterm_deregisters_and_exits_zero(admin, tmp_path: Path) -> None:
    port = free_port()
    env = dict(os.environ, SLUICE_TRTLLM_SERVE=f"{sys.executable} {STANDIN}")
    model_dir = resolve_llm("smollm2-135m-instruct", ROOT / "model_repository")
    argv = [sys.executable, "-m", "engines.launchers", "--engine", "trtllm", "--model", str(model_dir),
            "--served-model-name", "standin-sigterm", "--port", str(port), "--gateway", admin.url,
            "--name", "trt-sigterm"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, timeout_s=60)
        _wait_registered(admin, "trt-sigterm")
        assert "trt-sigterm" in _registered(admin)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "trt-sigterm" not in _registered(admin)  # deregistered on the way out
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0)
    finally:
        stop_process(proc)
