"""Interleaving the delta streams of one request's choices (n > 1)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

from engines.base import Delta


async def merge(streams: list[AsyncIterator[Delta]]) -> AsyncGenerator[tuple[int, Delta], None]:
    """Interleave several delta streams (n > 1), tagging each with its index.

    Closing the merged iterator cancels every inner stream (client disconnects
    abort all choices)."""
    if len(streams) == 1:
        # Closed here, not when the loop finalises the dropped generator a turn later:
        # a disconnected client's engine request is aborted before `merge` returns.
        only = streams[0]
        try:
            async for d in only:
                yield 0, d
        finally:
            if isinstance(only, AsyncGenerator):
                await only.aclose()
        return
    queue: asyncio.Queue[tuple[int, Delta | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, s: AsyncIterator[Delta]) -> None:
        try:
            async for d in s:
                await queue.put((i, d))
            await queue.put((i, None))
        except BaseException as e:  # forwarded to the consumer, which re-raises
            await queue.put((i, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
