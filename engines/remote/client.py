"""RemoteEngine: the LLMEngine contract over an OpenAI-compatible worker (vLLM, trtllm-serve).

One pooled `httpx.AsyncClient` per worker. Each `generate` runs the HTTP stream in
its own reader task that feeds a queue; cancelling that task (from `abort`, or
because the consumer was cancelled) leaves the `client.stream(...)` block, which
closes the connection mid-body. vLLM sees the disconnect and aborts the request,
freeing its batch slot. Deltas are produced by the pure `StreamAssembler`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from engines.base import Delta, EngineError, EngineRequest, EngineStats
from engines.errors import ErrorKind
from engines.remote.errors import normalize_error
from engines.remote.payload import DIALECTS, Dialect, build_body
from engines.remote.stream import StreamAssembler

log = logging.getLogger(__name__)

_END = object()  # queue sentinel: the reader finished without an exception
_STOP_GRACE_S = 1.0  # how long an asked-to-stop reader may take before it is cancelled
_DONE_GRACE_S = 2.0  # after the final Delta, how long the reader may take to read "[DONE]"


@dataclass(frozen=True, slots=True)
class RemoteEngineConfig:
    """How to reach one worker."""

    base_url: str  # e.g. "http://127.0.0.1:8100" (no trailing /v1)
    name: str = "remote"  # stable worker name, used in logs and X-Sluice-Worker
    dialect: Dialect = "vllm"  # which engine extras the worker accepts
    served_model: str | None = None  # model name on the worker, if it differs from the gateway's id
    connect_timeout_s: float = 5.0
    # Until the first chunk (and between the reads of any one chunk): a long prefill on a
    # busy CPU worker can take minutes.
    read_timeout_s: float = 600.0
    # Between two chunks once the first has come: decode steps are short, so a worker silent
    # this long is stopped or wedged (a killed one closes the connection and fails at once).
    stall_timeout_s: float = 60.0
    max_connections: int = 512
    api_key: str | None = None  # bearer token the worker expects, if any

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"worker URL must start with http:// or https://, got {self.base_url!r}")
        if self.dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {DIALECTS}, got {self.dialect!r}")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0 or self.stall_timeout_s <= 0:
            raise ValueError("timeouts must be > 0 seconds")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/")


class RemoteEngine:
    """LLMEngine over HTTP. `stats()` counts this client's own in-flight requests only;
    the router scrapes the worker's /metrics for its global load."""

    def __init__(self, config: RemoteEngineConfig, *, client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self.name = config.name
        self._client = client
        self._owns_client = client is None
        self._readers: dict[str, asyncio.Task[None]] = {}
        # Asking a reader to stop lets it leave the HTTP stream normally, which
        # closes the connection (and so aborts upstream). Cancelling a task that
        # is inside httpx's stream was seen to leave the pooled connection open
        # while the worker kept generating; cancellation is only the fallback.
        self._stops: dict[str, asyncio.Event] = {}
        self._max_seen = 0
        self._healthy = False

    async def start(self) -> None:
        """Open the connection pool and probe /health once (not fatal: the router keeps probing)."""
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
            timeout = httpx.Timeout(self.config.read_timeout_s, connect=self.config.connect_timeout_s)
            limits = httpx.Limits(max_connections=self.config.max_connections,
                                  max_keepalive_connections=min(64, self.config.max_connections))
            self._client = httpx.AsyncClient(base_url=self.config.url, timeout=timeout, limits=limits,
                                             headers=headers)
        self._healthy = await self.check_health()

    async def stop(self) -> None:
        for request_id in list(self._readers):
            await self.abort(request_id)
        if self._client is not None and self._owns_client:
            await self._client.aclose()
        self._client = None

    def ready(self) -> bool:
        return self._client is not None and self._healthy

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self._readers), waiting=0, max_batch_size_seen=self._max_seen)

    async def check_health(self, timeout_s: float = 5.0) -> bool:
        """True when the worker answers 200 on /health."""
        try:
            response = await self._http.get("/health", timeout=timeout_s)
        except httpx.HTTPError:
            self._healthy = False
            return False
        self._healthy = response.status_code == 200
        return self._healthy

    async def abort(self, request_id: str) -> None:
        """Close the request's upstream stream; idempotent, unknown ids are ignored."""
        reader = self._readers.get(request_id)
        if reader is not None and not reader.done():
            await self._stop_reader(request_id, reader)

    async def _stop_reader(self, request_id: str, reader: asyncio.Task[None]) -> None:
        stop = self._stops.get(request_id)
        if stop is not None:
            stop.set()
            await asyncio.wait({reader}, timeout=_STOP_GRACE_S)
        if not reader.done():
            reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)

    async def generate(self, request: EngineRequest) -> AsyncGenerator[Delta, None]:
        """Stream Deltas; raises EngineError before the first Delta (see LLMEngine)."""
        if request.request_id in self._readers:
            raise EngineError(f"duplicate request id {request.request_id!r}", ErrorKind.ALREADY_EXISTS)
        path, body = build_body(request, self.config.dialect, self.config.served_model)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        assembler = StreamAssembler(chat=request.kind == "chat")
        stop = asyncio.Event()
        self._stops[request.request_id] = stop
        headers = {"X-Request-Id": request.request_id, **(request.trace_headers or {})}
        reader = asyncio.create_task(self._read(path, body, headers, assembler, queue, stop))
        self._readers[request.request_id] = reader
        self._max_seen = max(self._max_seen, len(self._readers))
        try:
            async for delta in self._drain(queue, reader, assembler):
                yield delta
            if not reader.done():
                # Let the reader consume "[DONE]" so the connection returns to the pool.
                await asyncio.wait({reader}, timeout=_DONE_GRACE_S)
        finally:
            if not reader.done():
                # The consumer went away: closing the stream aborts upstream.
                await asyncio.shield(self._stop_reader(request.request_id, reader))
            self._readers.pop(request.request_id, None)
            self._stops.pop(request.request_id, None)

    async def _drain(self, queue: asyncio.Queue[Any], reader: asyncio.Task[None],
                     assembler: StreamAssembler) -> AsyncIterator[Delta]:
        sent_any = False
        while True:
            item = await _next_item(queue, reader)
            if item is _END or item is None:
                if not assembler.done:
                    # None: the reader was cancelled by abort(); _END: the body ended early.
                    final = assembler.finish() if item is _END else _abort_delta(assembler)
                    yield final
                return
            if isinstance(item, EngineError):
                if not sent_any:
                    raise item
                yield Delta(finish_reason="error", error=item.message,
                            completion_tokens=assembler.completion_tokens)
                return
            sent_any = True
            yield item
            if item.finish_reason is not None:
                return

    async def _read(self, path: str, body: dict[str, Any], headers: dict[str, str],
                    assembler: StreamAssembler, queue: asyncio.Queue[Any], stop: asyncio.Event) -> None:
        """Own the HTTP stream; put Deltas, one EngineError, or _END on the queue."""
        request_id = headers["X-Request-Id"]
        try:
            async with self._http.stream("POST", path, json=body, headers=headers) as response:
                if response.status_code != 200:
                    queue.put_nowait(normalize_error(response.status_code, await response.aread()))
                    return
                async for data in _sse_data(response, self.config.stall_timeout_s):
                    if data == "[DONE]" or stop.is_set():
                        break
                    for delta in assembler.feed(json.loads(data)):
                        queue.put_nowait(delta)
            queue.put_nowait(None if stop.is_set() else _END)  # None: aborted on request
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            log.warning("worker %s request %s: no chunk for %.0f s; giving up on it", self.name, request_id,
                        self.config.stall_timeout_s)
            queue.put_nowait(EngineError(f"worker {self.name} stopped sending for {self.config.stall_timeout_s:.0f} s",
                                         ErrorKind.UNAVAILABLE, retryable=True))
        except (httpx.HTTPError, ValueError) as exc:
            # Before the first byte this is retryable on another worker; after it,
            # _drain turns it into a final error Delta.
            log.warning("worker %s request %s failed: %r", self.name, request_id, exc)
            queue.put_nowait(EngineError(f"worker {self.name} failed: {type(exc).__name__}: {exc}",
                                         ErrorKind.UNAVAILABLE if isinstance(exc, httpx.TransportError)
                                         else ErrorKind.INTERNAL, retryable=True))

    @property
    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            raise EngineError(f"engine {self.name} is not started", ErrorKind.UNAVAILABLE, retryable=True)
        return self._client


async def _next_item(queue: asyncio.Queue[Any], reader: asyncio.Task[None]) -> Any:
    """The next queued item, or None once the reader task was cancelled with nothing left."""
    while True:
        if not queue.empty():
            return queue.get_nowait()
        if reader.done():
            if reader.cancelled():
                return None
            # The reader puts _END before finishing normally, so it must have crashed.
            return EngineError(f"worker stream reader failed: {reader.exception()!r}", ErrorKind.INTERNAL)
        getter = asyncio.ensure_future(queue.get())
        try:
            await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()  # also on our own cancellation: no orphaned queue.get()
        if getter.done() and not getter.cancelled():
            return getter.result()


async def _sse_data(response: httpx.Response, stall_timeout_s: float) -> AsyncIterator[str]:
    """The payloads of ``data:`` lines; comments (``: ping``) and other fields are skipped.

    After the first payload each line must come within `stall_timeout_s`, else TimeoutError;
    before it, only the client's read timeout applies (prefill may be long)."""
    lines = aiter(response.aiter_lines())
    started = False
    while True:
        try:
            if started:
                async with asyncio.timeout(stall_timeout_s):
                    line = await anext(lines)
            else:
                line = await anext(lines)
        except StopAsyncIteration:
            return
        if line.startswith("data:"):
            started = True
            yield line[5:].strip()


def _abort_delta(assembler: StreamAssembler) -> Delta:
    assembler.done = True
    return Delta(finish_reason="abort", completion_tokens=assembler.completion_tokens,
                 prompt_tokens=assembler.prompt_tokens, cached_tokens=assembler.cached_tokens)
