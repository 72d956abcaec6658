"""Shared plumbing for generation routes: admission, fan-out (n > 1) and SSE.

The SSE relay relies on sse-starlette: it sends `: ping` comments while the
request waits (queue, prefill) and cancels the generator when the client
disconnects; cancellation closes the engine stream, which aborts the request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from sse_starlette.sse import EventSourceResponse

from engines.base import Delta, EngineError, EngineRequest
from gateway.admission import Ticket
from gateway.errors import OpenAIError
from gateway.backends import RouteHints, Target
from gateway.fanout import merge
from gateway.llm_service import LLMModel, LLMService

log = logging.getLogger("sluice.gateway")


@dataclass(slots=True)
class Dispatch:
    """A request that has been admitted to the queue and routed, not yet run."""

    service: LLMService
    model: LLMModel
    requests: list[EngineRequest]
    targets: list[list[Target]]
    ticket: Ticket
    request_id: str
    created: int = field(default_factory=lambda: int(time.time()))
    _closed: bool = False

    @property
    def worker(self) -> str:
        """The worker that served the first choice: the last target tried (targets are
        tried in rank order), or the first-ranked one before anything ran."""
        tried = [t for t in self.targets[0] if t.dispatched]
        return tried[-1].name if tried else self.targets[0][0].name

    def headers(self, client_request_id: str | None) -> dict[str, str]:
        """Routing headers of the first choice. A streaming response sends them before
        generation starts, so after a failover they name the first-ranked worker; a
        non-streaming response computes them at the end and names the one that served."""
        h = {"X-Sluice-Worker": self.worker, "X-Request-Id": client_request_id or self.request_id}
        first = self.targets[0][0]
        # Lets clients and tests compare the router's prediction with the engine's
        # usage.prompt_tokens_details.cached_tokens request by request.
        if first.predicted_cached_tokens is not None:
            h["X-Sluice-Predicted-Cached-Tokens"] = str(first.predicted_cached_tokens)
        if first.reason is not None:
            h["X-Sluice-Route-Reason"] = first.reason
        return h

    async def deltas(self) -> AsyncIterator[tuple[int, Delta]]:
        """All choices' deltas, tagged with the choice index; frees the ticket at the end."""
        try:
            await self.service.wait_admitted(self.model, self.ticket)
            streams = [self.service.run(self.model, r, t) for r, t in zip(self.requests, self.targets)]
            async with aclosing(merge(streams)) as merged:
                async for item in merged:
                    yield item
        finally:
            self.close()

    def close(self) -> None:
        """Free the ticket and end every dispatched target that never ran (the client
        left before the stream started); idempotent. Every route calls it at the end."""
        for targets in self.targets:
            for t in targets:
                t.finish(None, False)
        if not self._closed:
            self._closed = True
            self.service.release(self.model, self.ticket)


def dispatch(service: LLMService, model: LLMModel, requests: list[EngineRequest], hints: RouteHints,
             prefix: str) -> Dispatch:
    """Rank, admit, and tell the router at once which worker each request goes to.

    The router's contract is no `await` between rank and dispatch: concurrent
    requests must see each other's load and speculative cache entries, or a burst
    is ranked blind and predictions miss. The caller must call `Dispatch.close()`."""
    targets = [service.targets(model, r, hints) for r in requests]
    ticket = service.admit(model)
    for ranked in targets:
        ranked[0].start()
    return Dispatch(service, model, requests, targets, ticket, prefix)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def error_body(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, OpenAIError):
        return exc.body()
    if isinstance(exc, EngineError):
        return OpenAIError.from_engine(exc).body()
    return OpenAIError(500, "internal error while streaming").body()


class _ClosingEventSourceResponse(EventSourceResponse):
    """Closes the event source explicitly when the response ends.

    On a client disconnect sse-starlette cancels its sender; if the generator was
    suspended at a `yield` it would only be closed later by garbage collection,
    and the engine request would run on. Closing it here aborts it at once."""

    def __init__(self, source: Any, on_close: Callable[[], None] | None = None, **kwargs: Any) -> None:
        super().__init__(source, **kwargs)
        self._source = source
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._source.aclose()
            finally:
                if self._on_close is not None:
                    self._on_close()


async def unless_disconnected(request: Any, work: Any, poll_s: float = 0.25) -> Any:
    """Await `work` (a coroutine) but cancel it if the client goes away, so a
    non-streaming request's engine work is aborted too."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise OpenAIError(499, "client closed the request", code="client_closed_request")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def sse(events: AsyncIterator[dict[str, Any]], *, ping_s: float, headers: dict[str, str],
        on_close: Callable[[], None] | None = None) -> EventSourceResponse:
    """Relay JSON payloads as SSE `data:` lines; end with `[DONE]`, or with an
    error event and then `[DONE]`, never by hanging."""

    async def gen() -> AsyncIterator[dict[str, str]]:
        try:
            async with aclosing(events) as it:
                async for payload in it:
                    yield {"data": json.dumps(payload, separators=(",", ":"), ensure_ascii=False)}
        except Exception as e:  # after the first byte the status code is gone: report in-band
            if not isinstance(e, (OpenAIError, EngineError)):
                log.exception("stream failed")
            yield {"data": json.dumps(error_body(e))}
        yield {"data": "[DONE]"}

    return _ClosingEventSourceResponse(gen(), ping=max(ping_s, 0.05), sep="\n", headers=headers,
                                       media_type="text/event-stream", on_close=on_close)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    u: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return u


class UsageTally:
    """Adds up usage over choices: prompt tokens once per prompt, completions summed."""

    def __init__(self, prompt_tokens: list[int]) -> None:
        self.prompt_tokens = list(prompt_tokens)  # per prompt
        self.completion: dict[int, int] = {}
        self.cached: dict[int, int] = {}

    def add(self, index: int, prompt_index: int, delta: Delta) -> None:
        self.completion[index] = delta.completion_tokens
        if delta.prompt_tokens is not None:
            self.prompt_tokens[prompt_index] = delta.prompt_tokens
        if delta.cached_tokens is not None:
            self.cached[prompt_index] = max(self.cached.get(prompt_index, 0), delta.cached_tokens)

    def body(self) -> dict[str, Any]:
        cached = sum(self.cached.values()) if self.cached else None
        return usage(sum(self.prompt_tokens), sum(self.completion.values()), cached)
