"""OpenAI streaming responses, and cancellation of non-streaming work when the client leaves."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request

from engines.errors import ErrorKind, SluiceError
from gateway.openai.errors import error_body
from gateway.sse import SSEResponse, relay

T = TypeVar("T")


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
