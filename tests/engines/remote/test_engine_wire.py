"""RemoteEngine against a raw loopback worker: what goes on the wire (headers, TLS) and what comes back."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engines.base import EngineError, EngineRequest, SamplingParams
from engines.errors import ErrorKind
from engines.remote import RemoteEngine, RemoteEngineConfig

_EVENTS = [{"choices": [{"index": 0, "text": "he", "token_ids": [1]}]},
           {"choices": [{"index": 0, "text": "llo", "token_ids": [2], "finish_reason": "length"}]},
           {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}]


def _response() -> bytes:
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in _EVENTS) + b"data: [DONE]\n\n"
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))


async def _worker(heads: list[dict[str, str]], conns: list[int],
                  tls: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(1)
        conn = str(len(conns))
        try:
            while True:
                raw = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = raw.decode("latin-1").split("\r\n")[:-2]
                if request_line.startswith("GET /health"):  # the health probe (httpx)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    continue
                head = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
                await reader.readexactly(int(head["content-length"]))
                heads.append({**head, "connection-number": conn})
                writer.write(_response())
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def _request(rid: str, trace: dict[str, str] | None = None) -> EngineRequest:
    return EngineRequest(request_id=rid, model="m", prompt_token_ids=[5, 6, 7],
                         sampling=SamplingParams(max_tokens=2), trace_headers=trace)


async def _run(engine: RemoteEngine, request: EngineRequest) -> tuple[str, str | None]:
    deltas = [d async for d in engine.generate(request)]
    return "".join(d.text for d in deltas), deltas[-1].finish_reason


TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "k=v"}


async def test_trace_context_key_and_request_id_reach_the_worker_on_a_reused_connection() -> None:
    heads: list[dict[str, str]] = []
    conns: list[int] = []
    async for port in _worker(heads, conns):
        engine = RemoteEngine(RemoteEngineConfig(f"http://127.0.0.1:{port}", api_key="sekret",
                                                 headers=(("X-Route", "a"),)))
        await engine.start()
        try:
            assert await _run(engine, _request("r1", TRACE)) == ("hello", "length")
            assert await _run(engine, _request("r2")) == ("hello", "length")
        finally:
            await engine.stop()
    first, second = heads
    assert first["traceparent"] == TRACE["traceparent"] and first["tracestate"] == "k=v"
    assert first["authorization"] == "Bearer sekret" and first["x-route"] == "a"
    assert first["x-request-id"] == "r1" and second["x-request-id"] == "r2"
    assert "traceparent" not in second  # only the attempt's own context, never a previous one's
    # The stream was read to its end, so its connection was reused.
    assert first["connection-number"] == second["connection-number"]


async def test_a_header_that_could_split_the_request_is_refused_before_sending() -> None:
    heads: list[dict[str, str]] = []
    async for port in _worker(heads, []):
        engine = RemoteEngine(RemoteEngineConfig(f"http://127.0.0.1:{port}"))
        await engine.start()
        try:
            with pytest.raises(EngineError) as info:
                await _run(engine, _request("r1", {"traceparent": "x\r\nX-Evil: 1"}))
            assert info.value.kind is ErrorKind.INVALID_ARG
        finally:
            await engine.stop()
    assert heads == []


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


async def test_an_https_worker_is_streamed_over_tls(self_signed: tuple[Path, Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = self_signed
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the client's default context trusts it
    heads: list[dict[str, str]] = []
    async for port in _worker(heads, [], tls=server_tls):
        engine = RemoteEngine(RemoteEngineConfig(f"https://127.0.0.1:{port}"))
        await engine.start()
        try:
            assert await _run(engine, _request("r1", TRACE)) == ("hello", "length")
        finally:
            await engine.stop()
    assert heads[0]["traceparent"] == TRACE["traceparent"]


async def _cut_worker(events: list[dict]) -> AsyncIterator[int]:
    """A worker that sends `events` and closes the connection mid-body (a worker killed there)."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = await reader.readuntil(b"\r\n\r\n")
        head = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in raw.decode().split("\r\n")[1:-2])}
        await reader.readexactly(int(head["content-length"]))
        body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + b"%x\r\n%s\r\n" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


@pytest.mark.parametrize(("events", "last"), [
    (_EVENTS[:1], ("error", "broken")),  # mid-answer: a lost worker, its stream may be resumed
    (_EVENTS[:2], ("length", None)),  # the answer had ended; only its usage and [DONE] were lost
])
async def test_a_stream_cut_mid_body_is_a_lost_worker_only_if_its_answer_had_not_ended(
        events: list[dict], last: tuple[str, str | None]) -> None:
    async for port in _cut_worker(events):
        engine = RemoteEngine(RemoteEngineConfig(base_url=f"http://127.0.0.1:{port}", name="w"))
        await engine.start()
        try:
            deltas = [d async for d in engine.generate(_request("cut"))]
        finally:
            await engine.stop()
        assert (deltas[-1].finish_reason, deltas[-1].fault) == last
        assert [t for d in deltas for t in d.token_ids] == [t for e in events for c in e["choices"]
                                                            for t in c["token_ids"]]
