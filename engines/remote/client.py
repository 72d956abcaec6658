"""RemoteEngine: the LLMEngine contract over an OpenAI-compatible worker (vLLM, trtllm-serve).

Streams run on `engines.remote.http1`, a keep-alive pool of plain HTTP/1.1 connections per
worker; health probes use httpx. `generate` reads the response in the consumer's own task:
each read hands over every byte that arrived since the previous one, the pure `SseLines` and
`StreamAssembler` turn them into Deltas, and `coalesce` merges the content deltas of one read
into one. Leaving the stream early (the consumer closed it, or `abort`) closes the connection
mid-body; vLLM sees the disconnect and aborts the request, freeing its batch slot.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import orjson

from engines.base import Delta, EngineError, EngineRequest, EngineStats
from engines.errors import ErrorKind
from engines.remote.errors import refusal
from engines.remote.http1 import Exchange, Pool, ProtocolError, header_lines
from engines.remote.payload import DIALECTS, Dialect, build_body
from engines.remote.splice import RelayCounts, SplicedBatch
from engines.remote.sse import SseLines
from engines.remote.stream import StreamAssembler, coalesce

log = logging.getLogger(__name__)

_DONE_GRACE_S = 2.0  # after the final Delta, how long the rest of the body ("[DONE]") may take
_ERROR_BODY_BYTES = 64 * 1024  # of a refusal's body, read to build the error


@dataclass(frozen=True, slots=True)
class RemoteEngineConfig:
    """How to reach one worker."""

    base_url: str  # e.g. "http://127.0.0.1:8100" (no trailing /v1)
    name: str = "remote"  # stable worker name, used in logs and X-Sluice-Worker
    dialect: Dialect = "vllm"  # which engine extras the worker accepts
    served_model: str | None = None  # model name on the worker, if it differs from the gateway's id
    connect_timeout_s: float = 5.0
    # Until the first chunk: a long prefill on a busy CPU worker can take minutes.
    read_timeout_s: float = 600.0
    # Between two chunks once the first has come: decode steps are short, so a worker silent
    # this long is stopped or wedged (a killed one closes the connection and fails at once).
    stall_timeout_s: float = 60.0
    max_connections: int = 512
    # A started stream that brings at least 3 tokens per this long is read once per interval, so the
    # events that arrive in between are read, and relayed, together: fewer reads and client events
    # per token, each at most this much later. 0: each read as soon as bytes arrive.
    read_interval_s: float = 0.0
    api_key: str | None = None  # bearer token the worker expects, if any
    headers: tuple[tuple[str, str], ...] = ()  # sent with every request (e.g. a proxy's routing header)
    # The worker schedules by request priority (vLLM --scheduling-policy priority): requests carry theirs.
    # Off, none is sent: vLLM refuses a priority other than 0 unless it was started so.
    priority: bool = False

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"worker URL must start with http:// or https://, got {self.base_url!r}")
        if self.dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {DIALECTS}, got {self.dialect!r}")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0 or self.stall_timeout_s <= 0:
            raise ValueError("timeouts must be > 0 seconds")
        if not 0.0 <= self.read_interval_s <= 1.0:
            raise ValueError(f"read_interval_s must be in [0, 1] seconds, got {self.read_interval_s}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/")

    def header_map(self) -> dict[str, str]:
        h = dict(self.headers)
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


class RemoteEngine:
    """LLMEngine over HTTP. `stats()` counts this client's own in-flight requests only;
    the router scrapes the worker's /metrics for its global load."""

    def __init__(self, config: RemoteEngineConfig, *, client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self.name = config.name
        self._client = client  # health probes
        self._owns_client = client is None
        self._pool: Pool | None = None
        self._live: dict[str, Exchange | None] = {}  # request id -> its exchange once the head came
        self._aborted: set[str] = set()
        self._max_seen = 0
        self._healthy = False
        self.relay_counts = RelayCounts()  # worker events spliced and decoded (sluice_relay_events)
        split = urlsplit(config.url)
        self._prefix = split.path.rstrip("/")
        host = split.hostname or "127.0.0.1"
        self._host_header = header_lines({"Host": split.netloc, **config.header_map()})
        self._addr = (host, split.port or (443 if split.scheme == "https" else 80), split.scheme == "https")

    async def start(self) -> None:
        """Open the connection pools and probe /health once (not fatal: the router keeps probing)."""
        if self._client is None:
            timeout = httpx.Timeout(self.config.read_timeout_s, connect=self.config.connect_timeout_s)
            self._client = httpx.AsyncClient(base_url=self.config.url, timeout=timeout,
                                             headers=self.config.header_map())
        if self._pool is None:
            host, port, tls = self._addr
            self._pool = Pool(host, port, max_connections=self.config.max_connections,
                              max_idle=min(64, self.config.max_connections),
                              connect_timeout_s=self.config.connect_timeout_s,
                              ssl=ssl.create_default_context() if tls else None)
        self._healthy = await self.check_health()

    async def stop(self) -> None:
        for request_id in list(self._live):
            await self.abort(request_id)
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._client is not None and self._owns_client:
            await self._client.aclose()
        self._client = None

    def ready(self) -> bool:
        return self._client is not None and self._healthy

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self._live), waiting=0, max_batch_size_seen=self._max_seen)

    async def check_health(self, timeout_s: float = 5.0) -> bool:
        """True when the worker answers 200 on /health."""
        if self._client is None:
            raise EngineError(f"engine {self.name} is not started", ErrorKind.UNAVAILABLE, retryable=True)
        try:
            response = await self._client.get("/health", timeout=timeout_s)
        except httpx.HTTPError:
            self._healthy = False
            return False
        self._healthy = response.status_code == 200
        return self._healthy

    async def abort(self, request_id: str) -> None:
        """Close the request's upstream stream; idempotent, unknown ids are ignored. Its
        `generate` then ends with a Delta(finish_reason="abort")."""
        if request_id not in self._live:
            return
        self._aborted.add(request_id)
        exchange = self._live.get(request_id)
        if exchange is not None:
            exchange.abort()

    async def generate(self, request: EngineRequest) -> AsyncGenerator[Delta, None]:
        """Stream Deltas; raises EngineError before the first Delta (see LLMEngine)."""
        rid = request.request_id
        if rid in self._live:
            raise EngineError(f"duplicate request id {rid!r}", ErrorKind.ALREADY_EXISTS)
        path, body = build_body(request, self.config.dialect, self.config.served_model, priority=self.config.priority)
        self._live[rid] = None
        self._max_seen = max(self._max_seen, len(self._live))
        exchange: Exchange | None = None
        spliced: SplicedBatch | None = None
        try:
            headers = {"X-Request-Id": request.api_request_id or rid, **(request.trace_headers or {})}
            exchange = await self._open(path, orjson.dumps(body), headers, rid)
            self._live[rid] = exchange
            if rid in self._aborted:
                exchange.abort()
            assembler = StreamAssembler(chat=request.kind == "chat")
            if request.text_json:
                spliced = SplicedBatch(assembler)
            async for delta in self._deltas(exchange, assembler, rid, spliced):
                yield delta
        finally:
            if spliced is not None:
                self.relay_counts.add(spliced)
            if exchange is not None:
                exchange.close()  # back to the pool if read to the end; else closed, which aborts upstream
            self._live.pop(rid, None)
            self._aborted.discard(rid)

    async def _open(self, path: str, payload: bytes, headers: dict[str, str], request_id: str) -> Exchange:
        """Send the request (with the request id and trace context in `headers`) and wait for the
        response head; a refusal raises its EngineError."""
        if self._pool is None:
            raise EngineError(f"engine {self.name} is not started", ErrorKind.UNAVAILABLE, retryable=True)
        try:
            extra = header_lines(headers)
        except (ValueError, UnicodeEncodeError) as exc:
            raise EngineError(f"request {request_id!r}: {exc}", ErrorKind.INVALID_ARG) from None
        head = (f"POST {self._prefix}{path} HTTP/1.1\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n"
                ).encode("latin-1") + extra + self._host_header + b"\r\n"
        try:
            exchange = await self._pool.exchange(head, payload, self.config.read_timeout_s)
            if exchange.status != 200:
                try:
                    raise refusal(self.name, exchange.status, await exchange.read_all(_ERROR_BODY_BYTES))
                finally:
                    exchange.close()
        except (OSError, ProtocolError, TimeoutError) as exc:
            raise self._failure(exc, request_id) from None
        return exchange

    async def _deltas(self, exchange: Exchange, assembler: StreamAssembler, rid: str,
                      spliced: SplicedBatch | None) -> AsyncIterator[Delta]:
        """The Deltas of the response body, the events of one read coalesced; with `spliced`, plain
        events are read through its template instead of being decoded (engines.remote.splice)."""
        lines = SseLines()
        sent_any = False
        interval_s, loop = self.config.read_interval_s, asyncio.get_running_loop()
        read_at = started_at = 0.0
        while True:
            failure: Exception | None
            try:
                # Rest before the next read only for a stream that brings at least 3 tokens an interval
                # (4 seen): fewer would save less than the rest costs, so a slower stream is read, and
                # relayed, as it comes.
                tokens = assembler.completion_tokens
                if interval_s and tokens >= 4 and tokens * interval_s >= 3 * (read_at - started_at) \
                        and (wait_s := read_at + interval_s - loop.time()) > 0:
                    await exchange.rest(wait_s)
                data = await exchange.read()
                read_at = loop.time()
                started_at = started_at if sent_any else read_at
                batch, ended, failure = self._read_events(data, lines, assembler, spliced) if data \
                    else ([], True, None)
            except (OSError, ProtocolError, TimeoutError) as exc:
                batch, ended, failure = [], True, exc
            for delta in batch:  # the events before a malformed one are relayed, then the failure
                if not sent_any:
                    sent_any = True
                    exchange.idle_timeout_s = self.config.stall_timeout_s
                yield delta
            if failure is not None:
                if rid in self._aborted:
                    yield _abort_delta(assembler)
                    return
                if assembler.pending_finish is not None and not assembler.done:
                    yield assembler.finish()  # the answer had ended: only its usage (and [DONE]) was lost
                    return
                error = self._failure(failure, rid)
                if not sent_any:
                    raise error from None
                yield Delta(finish_reason="error", error=error.message, completion_tokens=assembler.completion_tokens,
                            fault="stalled" if isinstance(failure, TimeoutError) else "broken")
                return
            if assembler.done or ended:
                if not assembler.done:  # the body (or [DONE]) ended before the final chunk
                    yield assembler.finish()
                await exchange.drain(_DONE_GRACE_S)  # read to the end so the connection is reused
                return

    def _read_events(self, data: bytes, lines: SseLines, assembler: StreamAssembler,
                     spliced: SplicedBatch | None) -> tuple[list[Delta], bool, ValueError | None]:
        """The Deltas of one read, its events coalesced; whether `[DONE]` came; and the ValueError of an
        event that is not JSON (or a line over the bound), the Deltas then those of the events before it."""
        batch: list[Delta] = []
        try:
            for payload in lines.feed(data):
                if payload == b"[DONE]":
                    return (spliced.take() if spliced is not None else coalesce(batch)), True, None
                if spliced is not None:
                    spliced.feed(payload)
                else:
                    self.relay_counts.decoded += 1
                    batch.extend(assembler.feed(orjson.loads(payload)))
        except ValueError as exc:
            return (spliced.take() if spliced is not None else coalesce(batch)), True, exc
        return (spliced.take() if spliced is not None else coalesce(batch)), False, None

    def _failure(self, exc: BaseException, request_id: str) -> EngineError:
        """Before the first byte this is retryable on another worker; after it, an error Delta."""
        if isinstance(exc, TimeoutError):
            log.warning("worker %s request %s: nothing for %.0f s; giving up on it", self.name, request_id,
                        self.config.stall_timeout_s)
            return EngineError(f"worker {self.name} stopped sending ({exc})", ErrorKind.UNAVAILABLE, retryable=True)
        log.warning("worker %s request %s failed: %r", self.name, request_id, exc)
        kind = ErrorKind.UNAVAILABLE if isinstance(exc, OSError) else ErrorKind.INTERNAL
        return EngineError(f"worker {self.name} failed: {type(exc).__name__}: {exc}", kind, retryable=True)


def _abort_delta(assembler: StreamAssembler) -> Delta:
    assembler.done = True
    return Delta(finish_reason="abort", completion_tokens=assembler.completion_tokens,
                 prompt_tokens=assembler.prompt_tokens, cached_tokens=assembler.cached_tokens)
