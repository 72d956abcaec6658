"""Server-sent events shared by the OpenAI and KServe streaming routes.

A stream ends with its protocol's terminator, or with an error event first,
never by hanging. sse-starlette sends `: ping` comments while the request waits
(queue, prefill) and stops the generator when the client disconnects; closing
the generator closes the engine stream, which aborts the engine request.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from sse_starlette.sse import EventSourceResponse

from engines.errors import SluiceError

log = logging.getLogger("sluice.sse")


class ClosingEventSourceResponse(EventSourceResponse):
    """Closes the event source explicitly when the response ends.

    On a client disconnect sse-starlette cancels its sender; if the generator was
    suspended at a `yield` it would only be closed later by garbage collection,
    and the engine request would run on. Closing it here aborts it at once."""

    def __init__(self, source: AsyncIterator[dict[str, str]], on_close: Callable[[], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(source, **kwargs)
        self._source = source
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._source.aclose()  # type: ignore[attr-defined]
            finally:
                if self._on_close is not None:
                    self._on_close()


def relay(events: AsyncIterator[dict[str, Any]], *, error_body: Callable[[BaseException], dict[str, Any]],
          done: str | None, ping_s: float, headers: dict[str, str] | None = None,
          on_close: Callable[[], None] | None = None) -> EventSourceResponse:
    """JSON payloads as `data:` lines. A failure after the first byte becomes one error
    event (the status code is gone by then); `done` (e.g. "[DONE]") is sent last."""

    async def gen() -> AsyncGenerator[dict[str, str], None]:
        try:
            async with aclosing(events) as it:  # type: ignore[type-var]
                async for payload in it:
                    yield {"data": json.dumps(payload, separators=(",", ":"), ensure_ascii=False)}
        except Exception as e:
            if not isinstance(e, SluiceError):
                log.exception("stream failed")
            yield {"data": json.dumps(error_body(e))}
        if done is not None:
            yield {"data": done}

    return ClosingEventSourceResponse(gen(), ping=max(ping_s, 0.05), sep="\n", headers=headers or {},
                                      media_type="text/event-stream", on_close=on_close)
