"""A lean streaming HTTP/1.1 client for relay benchmarks: one keep-alive connection per stream.

The benchmarks run the client, the worker and the relay under test on the same two cores, so
the client has to cost as little as possible: it parses only the status line, the headers and
the chunked framing, splits SSE events on blank lines, and finds content with a byte search
(`"text":"` / `"content":"` followed by something other than `"`); only the usage chunk and
error events are decoded as JSON. Every event is stamped with the time its bytes were read.

`StreamConn.post_stream(path, body)` returns a `StreamResult`: TTFT (send to the first event
with content), the arrival time of every content event, completion tokens from the usage
chunk, cached tokens, whether `[DONE]` arrived, and any error event.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import orjson

_CONTENT_KEYS = (b'"text":"', b'"content":"')


@dataclass(slots=True)
class StreamResult:
    status: int
    sent_s: float  # perf_counter at send
    ttft_s: float | None = None  # send to the first content event
    content_times_s: list[float] = field(default_factory=list)  # perf_counter of each content event
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    done: bool = False  # `data: [DONE]` arrived
    error: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    end_s: float = 0.0

    @property
    def itl_s(self) -> list[float]:
        t = self.content_times_s
        return [b - a for a, b in pairwise(t)]


def _has_content(event: bytes) -> bool:
    for key in _CONTENT_KEYS:
        i = event.find(key)
        if i >= 0 and event[i + len(key): i + len(key) + 1] != b'"':
            return True
    return False


class StreamConn:
    """One keep-alive connection to host:port; requests on it run one after another."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None) -> None:
        self.host, self.port = host, port
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
        self._reader = self._writer = None

    async def post_stream(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
                          ) -> StreamResult:
        payload = orjson.dumps(body)
        extra = self.extra + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n{extra}\r\n").encode()
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
        assert self._reader is not None
        self._writer.write(head + payload)
        result = StreamResult(0, time.perf_counter())
        try:
            await self._read_response(self._reader, result)
        except BaseException:
            await self.close()  # half-read: the connection cannot be reused
            raise
        result.end_s = time.perf_counter()
        if result.headers.get("connection", "").lower() == "close":
            await self.close()
        return result

    async def _read_response(self, reader: asyncio.StreamReader, result: StreamResult) -> None:
        status_line = await reader.readuntil(b"\r\n")
        result.status = int(status_line.split(b" ", 2)[1])
        raw = await reader.readuntil(b"\r\n\r\n")
        for line in raw.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if sep:
                result.headers[name.decode("latin-1").strip().lower()] = value.decode("latin-1").strip()
        events = _Events(result)
        if result.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                data = await reader.readexactly(size + 2)
                events.feed(data[:-2], time.perf_counter())
        else:
            length = int(result.headers.get("content-length", "0"))
            remaining = length
            while remaining > 0:
                data = await reader.read(min(remaining, 1 << 16))
                if not data:
                    raise ConnectionError("connection closed mid-body")
                remaining -= len(data)
                events.feed(data, time.perf_counter())
        events.feed(b"\n\n", time.perf_counter())  # a last event without its blank line


class _Events:
    """Splits SSE bytes into events and records what the benchmark needs from each."""

    def __init__(self, result: StreamResult) -> None:
        self.r = result
        self.buf = b""

    def feed(self, data: bytes, now: float) -> None:
        buf = self.buf + data if self.buf else data
        if b"\r\n" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        parts = buf.split(b"\n\n")
        self.buf = parts.pop()
        for event in parts:
            if event:
                self._event(event, now)

    def _event(self, event: bytes, now: float) -> None:
        r = self.r
        if not event.startswith(b"data:"):
            if r.status != 200 and event.startswith(b"{"):
                r.error = event.decode(errors="replace")[:500]
            return  # comments (": ping") and other fields
        data = event[5:].strip()
        if data == b"[DONE]":
            r.done = True
            return
        if _has_content(data):
            if r.ttft_s is None:
                r.ttft_s = now - r.sent_s
            r.content_times_s.append(now)
        if b'"usage":{' in data or data.startswith(b'{"error"'):
            obj = orjson.loads(data)
            if "error" in obj:
                r.error = str(obj["error"])[:500]
            usage = obj.get("usage") or {}
            r.completion_tokens = int(usage.get("completion_tokens") or r.completion_tokens)
            r.prompt_tokens = int(usage.get("prompt_tokens") or r.prompt_tokens)
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                r.cached_tokens = int(details["cached_tokens"])
