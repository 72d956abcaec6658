"""OpenAI streaming responses, and cancellation of non-streaming work when the client leaves.

Stream chunks as JSON bytes, built from a per-response template.

Every chunk of one streamed response repeats the same envelope (id, object, created, model,
system_fingerprint, and `usage: null` when usage was asked for); only the choices change. The
envelope is serialised once per response, and the common chunk (one choice carrying text and
nothing else) is spliced from fixed pieces around the text, so a relayed token costs one string
encoding instead of building and serialising a dict; a text a remote worker's events already
carried as JSON (`Delta.text_json`) is spliced in as it is. Other chunks go through orjson. The
bytes are the same JSON as serialising the equivalent dict.

`usage` objects, summed over the choices of one response.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import orjson
from fastapi import Request

from engines.base import Delta
from engines.errors import ErrorKind, SluiceError
from gateway.openai.errors import error_body
from gateway.sse import SSEResponse, relay

T = TypeVar("T")


def json_body(text: str) -> bytes:
    """`text` as a JSON string body (no quotes), as orjson writes it."""
    return orjson.dumps(text)[1:-1]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def unless_disconnected(request: Request, work: Awaitable[T], poll_s: float = 0.25) -> T:
    """Await `work` but cancel it if the client goes away, so a non-streaming
    request's engine work is aborted too."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise SluiceError("client closed the request", ErrorKind.CANCELLED)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def sse(events: AsyncIterator[dict[str, Any] | bytes], *, ping_s: float, headers: dict[str, str],
        on_close: Callable[[], None] | None = None) -> SSEResponse:
    """OpenAI streams end with `data: [DONE]`, after an `{"error": ...}` event on failure."""
    return relay(events, error_body=error_body, done="[DONE]", ping_s=ping_s, headers=headers, on_close=on_close)


class ChunkEncoder:
    def __init__(self, request_id: str, obj: str, created: int, model: str, *, include_usage: bool) -> None:
        envelope = orjson.dumps({"id": request_id, "object": obj, "created": created, "model": model,
                                 "system_fingerprint": None})
        self._head = envelope[:-1] + b',"choices":['
        self._tail = b'],"usage":null}' if include_usage else b"]}"
        self._usage_head = envelope[:-1] + b',"choices":[],"usage":'

    def choices(self, choices: list[dict[str, Any]]) -> bytes:
        """A chunk with these choices (any content)."""
        return self._head + b",".join(orjson.dumps(c) for c in choices) + self._tail

    def text(self, index: int, text: str) -> bytes:
        """A completion chunk: choice `index` adds `text` (no logprobs, not finished)."""
        return (self._head + b'{"index":' + str(index).encode() + b',"text":' + orjson.dumps(text)
                + b',"logprobs":null,"finish_reason":null}' + self._tail)

    def text_json(self, index: int, body: bytes) -> bytes:
        """`text` for a text already written as a JSON string body (engines.remote.splice)."""
        return (self._head + b'{"index":' + str(index).encode() + b',"text":"' + body
                + b'","logprobs":null,"finish_reason":null}' + self._tail)

    def content_json(self, index: int, body: bytes) -> bytes:
        """`content` for a content already written as a JSON string body (engines.remote.splice)."""
        return (self._head + b'{"index":' + str(index).encode() + b',"delta":{"content":"' + body
                + b'"},"logprobs":null,"finish_reason":null}' + self._tail)

    def content(self, index: int, content: str) -> bytes:
        """A chat chunk: choice `index` adds `content` (no logprobs, not finished)."""
        return (self._head + b'{"index":' + str(index).encode() + b',"delta":{"content":' + orjson.dumps(content)
                + b'},"logprobs":null,"finish_reason":null}' + self._tail)

    def usage(self, usage: dict[str, Any]) -> bytes:
        """The final chunk of a stream that asked for usage."""
        return self._usage_head + orjson.dumps(usage) + b"}"


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
    """Prompt tokens counted once per prompt, completion tokens summed over choices."""

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
