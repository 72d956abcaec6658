"""RemoteEngine and the trtllm launcher against the trtllm-serve STAND-IN.

TensorRT-LLM itself has not run here (no NVIDIA GPU). The stand-in
(tests/standins/trtllm_standin.py) reproduces trtllm-serve's documented HTTP
shapes; it is started through the real launcher (`python -m engines.launchers
--engine trtllm`), so the generated YAML and command line are exercised too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from engines.base import Delta, EngineError, EngineRequest, SamplingParams
from engines.launchers import trtllm
from engines.launchers.spec import WorkerSpec
from engines.remote import RemoteEngine, RemoteEngineConfig
from tests.integration.vllm_support import free_port, stop_process, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "standins" / "trtllm_standin.py"


class _AdminRecorder(BaseHTTPRequestHandler):
    calls: list[tuple[str, str, dict[str, object] | None]] = []

    def _record(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.calls.append((method, self.path, body))
        self.send_response(201 if method == "POST" else 204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802
        self._record("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._record("DELETE")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def admin() -> Iterator[tuple[str, list[tuple[str, str, dict[str, object] | None]]]]:
    """A fake gateway admin API that records worker (de)registrations."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AdminRecorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _AdminRecorder.calls
    server.shutdown()


def _wait_registered(calls: list[tuple[str, str, dict[str, object] | None]], name: str) -> None:
    """The launcher registers after its own health check; wait (bounded) for the POST."""
    for _ in range(100):
        if any(m == "POST" and b and b.get("name") == name for m, _, b in calls):
            return
        time.sleep(0.1)


@pytest.fixture(scope="module")
def standin_worker(admin, tmp_path_factory) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The launcher running the stand-in as its `trtllm-serve`, registered with the fake admin API."""
    gateway, _ = admin
    port = free_port()
    model_dir = tmp_path_factory.mktemp("standin-model")
    env = dict(os.environ, SLUICE_TRTLLM_SERVE=f"{sys.executable} {STANDIN} --token-delay-s 0.05")
    argv = [sys.executable, "-m", "engines.launchers", "--engine", "trtllm", "--model", str(model_dir),
            "--served-model-name", "standin-model", "--port", str(port), "--max-model-len", "1024",
            "--gateway", gateway, "--name", "trt-standin"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout_s=60)
        _wait_registered(admin[1], "trt-standin")
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


def test_standin_launcher_registers_with_gateway(standin_worker, admin) -> None:
    url, _ = standin_worker
    _, calls = admin
    posts = [body for method, path, body in calls if method == "POST" and path == "/v1/admin/workers"]
    assert posts
    tokenizer = posts[-1].pop("tokenizer")  # the model directory, so the gateway can load its tokenizer
    assert tokenizer and Path(tokenizer).is_dir()
    assert posts[-1] == {
        "name": "trt-standin", "url": url, "models": ["standin-model"], "engine": "trtllm", "block_size": 32,
        "kv_events_endpoint": f"{url}/kv_cache_events", "kv_events_replay_endpoint": None}


async def test_standin_completion_streams_and_reports_cached_tokens(engine: RemoteEngine) -> None:
    ids = list(range(100, 200))  # 3 full blocks of 32
    first = await _collect(engine, _req("c1", ids))
    assert "".join(d.text for d in first).startswith(" t")
    assert first[-1].finish_reason == "length" and first[-1].prompt_tokens == 100
    second = await _collect(engine, _req("c2", ids))
    assert second[-1].cached_tokens == 96 and second[-1].completion_tokens == 4


async def test_standin_chat_streams(engine: RemoteEngine) -> None:
    chat = {"model": "x", "messages": [{"role": "user", "content": "hello"}]}
    deltas = await _collect(engine, _req("h1", [], kind="chat", chat_body=chat))
    assert len([d for d in deltas if d.text]) == 4 and deltas[-1].finish_reason == "length"


async def test_standin_kv_cache_events_carry_token_ids(engine: RemoteEngine, standin_worker) -> None:
    url, _ = standin_worker
    ids = list(range(500, 564))  # 2 new blocks
    await _collect(engine, _req("k1", ids))
    events = httpx.post(f"{url}/kv_cache_events").json()
    stored = [b for e in events if e["data"]["type"] == "stored" for b in e["data"]["blocks"]]
    tokens = [t["token_id"] for b in stored for t in b["tokens"]]
    assert tokens[-64:] == ids


async def test_standin_refusals_are_openai_errors(engine: RemoteEngine, standin_worker) -> None:
    url, _ = standin_worker
    with pytest.raises(EngineError) as too_long:
        await _collect(engine, _req("e1", [1] * 1000, max_tokens=100))
    assert (too_long.value.status_code, too_long.value.err_type, too_long.value.retryable) == (
        400, "invalid_request_error", False)
    # A vLLM-dialect client sends vLLM-only fields, which trtllm-serve's strict models refuse.
    vllm_style = RemoteEngine(RemoteEngineConfig(url, dialect="vllm"))
    await vllm_style.start()
    try:
        with pytest.raises(EngineError) as strict:
            await _collect(vllm_style, _req("e2", [1, 2]))
        assert strict.value.status_code == 400 and "Extra inputs" in strict.value.message
    finally:
        await vllm_style.stop()


async def test_standin_faults_before_and_after_first_byte(standin_worker) -> None:
    url, _ = standin_worker
    for fault, expect in (("html-500", "raise"), ("midstream-error", "error"), ("midstream-close", "error")):
        client = httpx.AsyncClient(base_url=url, headers={"X-Standin-Fault": fault})
        eng = RemoteEngine(RemoteEngineConfig(url, dialect="trtllm"), client=client)
        await eng.start()
        try:
            if expect == "raise":
                with pytest.raises(EngineError) as err:
                    await _collect(eng, _req(f"f-{fault}", [1, 2]))
                assert err.value.retryable and err.value.status_code == 500
            else:
                deltas = await _collect(eng, _req(f"f-{fault}", [1, 2], max_tokens=6))
                assert deltas[0].text and deltas[-1].finish_reason == "error" and deltas[-1].error
        finally:
            await eng.stop()
            await client.aclose()


async def _running(url: str) -> int:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"{url}/metrics")).json()[0]["numActiveRequests"]


async def _wait_running(url: str, predicate, attempts: int = 100) -> int:
    value = await _running(url)
    for _ in range(attempts):
        if predicate(value):
            return value
        await asyncio.sleep(0.1)
        value = await _running(url)
    return value


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


def test_standin_launcher_sigterm_deregisters_and_exits_zero(admin, tmp_path: Path) -> None:
    gateway, calls = admin
    port = free_port()
    env = dict(os.environ, SLUICE_TRTLLM_SERVE=f"{sys.executable} {STANDIN}")
    argv = [sys.executable, "-m", "engines.launchers", "--engine", "trtllm", "--model", str(tmp_path),
            "--port", str(port), "--gateway", gateway, "--name", "trt-sigterm"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, timeout_s=60)
        _wait_registered(calls, "trt-sigterm")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert ("DELETE", "/v1/admin/workers/trt-sigterm", None) in calls
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0)
    finally:
        stop_process(proc)
