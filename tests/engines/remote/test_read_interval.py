"""RemoteEngine's read interval against a raw loopback worker: a fast stream is read, and relayed, once
per interval with nothing lost; one that brings fewer than 3 tokens an interval is read as it comes,
never held (resting would cost more than it saves)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from engines.base import Delta, EngineRequest, SamplingParams
from engines.remote import RemoteEngine, RemoteEngineConfig
from engines.remote.http1 import Exchange

TOKENS = 40


def _event(obj: dict[str, object]) -> bytes:
    data = b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _worker(pause_s: float, tokens: int) -> AsyncIterator[int]:
    """A worker that streams `tokens` plain events, `pause_s` apart, each in a write of its own."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    continue
                length = next(int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
                              if k.lower() == b"content-length")
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                for i in range(tokens):
                    writer.write(_event({"id": "w", "choices": [{"index": 0, "text": f" t{i}", "logprobs": None,
                                                                 "finish_reason": None, "token_ids": [i]}]}))
                    await writer.drain()
                    await asyncio.sleep(pause_s)
                writer.write(_event({"id": "w", "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}))
                writer.write(_event({"id": "w", "choices": [], "usage": {"prompt_tokens": 3,
                                                                         "completion_tokens": tokens}}))
                writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def _stream(port: int, interval_s: float) -> tuple[list[Delta], RemoteEngine]:
    engine = RemoteEngine(RemoteEngineConfig(f"http://127.0.0.1:{port}", read_interval_s=interval_s))
    await engine.start()
    request = EngineRequest("r1", "m", [5, 6, 7], SamplingParams(max_tokens=TOKENS), text_json=True)
    try:
        return [d async for d in engine.generate(request)], engine
    finally:
        await engine.stop()


@pytest.fixture
def rests(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The delays of every `Exchange.rest` call."""
    seen: list[float] = []
    original = Exchange.rest

    async def spy(self: Exchange, delay_s: float) -> None:
        seen.append(delay_s)
        await original(self, delay_s)

    monkeypatch.setattr(Exchange, "rest", spy)
    return seen


def _text(deltas: list[Delta]) -> str:
    return "".join(json.loads(b'"' + d.text_json + b'"') for d in deltas if d.text_json is not None)


async def test_a_fast_stream_is_read_once_per_interval_and_loses_nothing(rests: list[float]) -> None:
    async for port in _worker(pause_s=0.002, tokens=TOKENS):  # ~80 ms of events: one or two half-second rests
        deltas, engine = await _stream(port, 0.5)
    texts = [d for d in deltas if d.text_json is not None]
    assert _text(deltas) == "".join(f" t{i}" for i in range(TOKENS))
    assert 2 <= len(texts) <= 5 and rests  # the first read at once, the rest gathered by the rests
    assert deltas[-1].finish_reason == "length" and deltas[-1].completion_tokens == TOKENS
    assert engine.relay_counts.spliced >= TOKENS - 2


async def test_a_stream_of_fewer_than_three_tokens_an_interval_is_never_held(rests: list[float]) -> None:
    async for port in _worker(pause_s=0.08, tokens=8):  # 0.08 s apart: 1.25 tokens per 0.1 s interval
        deltas, _ = await _stream(port, 0.1)
    assert _text(deltas) == "".join(f" t{i}" for i in range(8))
    assert rests == []
    assert len([d for d in deltas if d.text_json is not None]) == 8  # each token relayed as it came


async def test_no_interval_never_rests(rests: list[float]) -> None:
    async for port in _worker(pause_s=0.002, tokens=TOKENS):
        deltas, _ = await _stream(port, 0.0)
    assert _text(deltas) == "".join(f" t{i}" for i in range(TOKENS)) and rests == []
