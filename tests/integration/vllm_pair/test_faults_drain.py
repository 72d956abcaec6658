"""SIGTERM to `sluice serve`: in-flight streams drain, new requests get 503, the process exits 0.

Gateways of this module's own (they are terminated) in front of the session's two real
vLLM workers. While draining, the gateway keeps listening: a new connection and a
keep-alive connection opened before the signal both get 503 with Retry-After in OpenAI's
shape, and /health answers 503. A stream that ends before the deadline ends normally and
the process exits right after it; a stream still running at the deadline ends with an
error event, then `[DONE]`, and the process exits at the deadline.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import MODEL, Worker, gateway_over
from tests.integration.vllm_support import EngineBrake, held_mid_stream
from tests.servers import Server

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


async def _stream(http: httpx.AsyncClient, prompt: str, max_tokens: int, first: asyncio.Event,
                  payloads: list[str] | None = None) -> list[str]:
    """Stream a completion; `first` is set on its first event."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    payloads = [] if payloads is None else payloads
    async with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                payloads.append(line[6:])
                first.set()
    return payloads


def _finish_reason(payloads: list[str]) -> str | None:
    for p in reversed(payloads[:-1]):
        choices = json.loads(p).get("choices") or []
        if choices and choices[0].get("finish_reason"):
            return str(choices[0]["finish_reason"])
    return None


async def _exit_code(server: Server, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            return server.proc.returncode
        await asyncio.sleep(0.05)
    return None


def _client_port(r: httpx.Response) -> int:
    return int(r.extensions["sluice_client_port"])


async def _record_client_port(r: httpx.Response) -> None:
    """A response hook: the local port, read while the connection is surely open (a draining
    server may close it right after its answer)."""
    r.extensions["sluice_client_port"] = r.extensions["network_stream"].get_extra_info("client_addr")[1]


async def _stopped_mid_stream(http: httpx.AsyncClient, workers: list[Worker], stack: ExitStack
                              ) -> asyncio.Task[list[str]]:
    """A long stream under way with every engine held still (SIGSTOP) before it could finish, so it
    is certainly still running at the drain deadline; `stack` resumes the engines. They are braked
    while the stream starts (see `EngineBrake`); if it still ends instead of going quiet once held,
    it is set up again."""
    brake = stack.enter_context(EngineBrake([w.proc.pid for w in workers]))
    for attempt in range(6):
        first, payloads = asyncio.Event(), []
        stream = asyncio.create_task(_stream(http, f"drain deadline story {attempt}", 1800, first, payloads))
        await asyncio.wait_for(first.wait(), 120)
        if await held_mid_stream(stream, lambda p=payloads: len(p), brake, [w.proc.pid for w in workers]):
            return stream
        await stream
    raise AssertionError("the stream kept finishing before the engines were stopped")


async def test_at_the_deadline_streams_end_with_an_error_and_new_requests_get_503(workers: list[Worker],
                                                                                   tmp_path: Path) -> None:
    gateway = gateway_over(workers, tmp_path, "--drain-timeout-s", "4")
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http, \
                httpx.AsyncClient(base_url=gateway.url, timeout=60,
                                  event_hooks={"response": [_record_client_port]}) as keep_alive:
            with ExitStack() as stack:
                stream = await _stopped_mid_stream(http, workers, stack)
                # Opened only now: the client drops a connection idle for 5 s (httpx's expiry), and
                # setting the stream up may take longer than that on a busy machine.
                before = await keep_alive.get("/v1/models")
                assert before.status_code == 200
                gateway.proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                await asyncio.sleep(0.3)  # the signal is handled on the server's event loop
                await _refused_while_draining(gateway, keep_alive, before)
                payloads = await asyncio.wait_for(stream, 60)
            ended = time.monotonic() - signalled
            print(f"\nFAULT-TIMING drain deadline: stream ended {ended:.2f} s after SIGTERM (deadline 4 s)")
            assert json.loads(payloads[-2])["error"]["code"] == "shutting_down" and payloads[-1] == "[DONE]"
            assert _finish_reason(payloads) is None  # it was cut, not finished
        code = await _exit_code(gateway, 30)
        print(f"FAULT-TIMING drain deadline: exited {time.monotonic() - signalled:.2f} s after SIGTERM")
        assert code == 0, gateway.log()[-3000:]
        assert "drain deadline passed" in gateway.log()
    finally:
        gateway.stop()


async def _refused_while_draining(gateway: Server, keep_alive: httpx.AsyncClient, before: httpx.Response) -> None:
    health = await keep_alive.get("/health")
    assert health.status_code == 503 and health.json()["detail"] == "draining"
    # Still the keep-alive connection opened before the drain, and the only one in the pool,
    # so the refused request below travels on it too. (Its own answer closes the connection,
    # which makes reading the refused response's socket racy.)
    assert _client_port(health) == _client_port(before)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    async with keep_alive.stream("POST", "/v1/completions", json=body) as refused:
        await refused.aread()
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "shutting_down" and refused.headers["connection"] == "close"
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as fresh:
        r = await fresh.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True})
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
        kserve = await fresh.get("/v2/health/ready")
        assert kserve.status_code == 503 and "shutting down" in kserve.json()["error"]


async def test_streams_that_finish_in_time_end_normally_and_the_process_exits_after_them(workers: list[Worker],
                                                                                          tmp_path: Path) -> None:
    gateway = gateway_over(workers, tmp_path, "--drain-timeout-s", "120")
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
            firsts = [asyncio.Event(), asyncio.Event()]
            streams = [asyncio.create_task(_stream(http, f"drain in time {i}", 150 + 100 * i, firsts[i]))
                       for i in range(2)]
            await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), 120)
            gateway.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(*streams), 110)
            finished = time.monotonic() - signalled
        for payloads in results:
            assert _finish_reason(payloads) == "length" and payloads[-1] == "[DONE]", payloads[-3:]
            assert all("error" not in json.loads(p) for p in payloads[:-1])
        code = await _exit_code(gateway, 60)
        exited = time.monotonic() - signalled
        print(f"\nFAULT-TIMING drain in time: streams done {finished:.2f} s, exit {exited:.2f} s after SIGTERM")
        assert code == 0, gateway.log()[-3000:]
        # It exited once the streams were done, not at the deadline.
        assert "drained: no request in flight" in gateway.log() and "drain deadline passed" not in gateway.log()
    finally:
        gateway.stop()
