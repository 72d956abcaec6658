"""The CPU pool's tokenization entry: refused past the size bound, inline when small, on a bulk
thread otherwise (without a render's deadline), and 503 when every thread stays busy. Bulk work
never takes a render's thread, and one key holds at most its share of the bulk threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from engines.errors import ErrorKind, SluiceError
from gateway.cpu_pool import INLINE_CHARS, Renderer
from gateway.security.access import current_key_id


def _thread() -> str:
    return threading.current_thread().name


def test_size_bound_inline_and_off_loop() -> None:
    pool = Renderer(timeout_s=0.05, threads=1, max_prompt_chars=10_000)

    async def main() -> None:
        with pytest.raises(SluiceError) as e:
            await pool.tokenize(_thread, 10_001, "prompt")
        assert e.value.kind is ErrorKind.INVALID_ARG and e.value.param == "prompt" and "10000" in e.value.message
        assert await pool.tokenize(_thread, INLINE_CHARS, "prompt") == threading.current_thread().name
        assert (await pool.tokenize(_thread, INLINE_CHARS + 1, "prompt")).startswith("sluice-bulk-")
        assert (await pool.tokenize(_thread, 0, "tokens", work=INLINE_CHARS + 1)).startswith("sluice-bulk-")
        # No render deadline: work that outlasts timeout_s still answers.
        assert await pool.tokenize(lambda: threading.Event().wait(0.2), INLINE_CHARS + 1, "prompt") is False

    try:
        asyncio.run(main())
    finally:
        pool.close()


def test_a_busy_pool_refuses_with_retry_after() -> None:
    pool = Renderer(timeout_s=0.05, threads=1, bulk_threads=1)
    release = threading.Event()

    async def main() -> None:
        first = asyncio.ensure_future(pool.tokenize(lambda: release.wait(5), INLINE_CHARS + 1, "prompt"))
        await asyncio.sleep(0.01)
        with pytest.raises(SluiceError) as e:
            await pool.tokenize(_thread, INLINE_CHARS + 1, "prompt")
        assert e.value.kind is ErrorKind.OVERLOADED and e.value.retry_after_s == 1.0
        release.set()
        assert await first is True

    try:
        asyncio.run(main())
    finally:
        release.set()
        pool.close()


def test_bulk_work_does_not_starve_renders_and_one_key_holds_its_share() -> None:
    pool = Renderer(timeout_s=0.05, threads=1, bulk_threads=2)  # a key's share: 1 bulk thread
    release = threading.Event()

    async def tokenize_as(key: str, fn: Callable[[], object] = lambda: release.wait(5)) -> object:
        current_key_id.set(key)  # each task has its own context
        return await pool.tokenize(fn, INLINE_CHARS + 1, "prompt")

    async def main() -> None:
        held = [asyncio.ensure_future(tokenize_as("a")) for _ in range(2)]
        await asyncio.sleep(0.01)
        # A render has its own thread, whatever bulk work is in flight.
        assert (await pool.run(_thread)).startswith("sluice-render-")
        # Key a's second job waited for a's share, not for a thread, and was refused...
        with pytest.raises(SluiceError) as e:
            await held[1]
        assert e.value.kind is ErrorKind.OVERLOADED and "key" in e.value.message
        # ... while another key gets the other bulk thread.
        assert str(await tokenize_as("b", _thread)).startswith("sluice-bulk-")
        release.set()
        assert await held[0] is True

    try:
        asyncio.run(main())
    finally:
        release.set()
        pool.close()
