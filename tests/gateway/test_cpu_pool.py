"""The CPU pool's tokenization entry: refused past the size bound, inline when small, on a worker
thread otherwise (without a render's deadline), and 503 when every thread stays busy."""

from __future__ import annotations

import asyncio
import threading

import pytest

from engines.errors import ErrorKind, SluiceError
from gateway.cpu_pool import INLINE_CHARS, Renderer


def _thread() -> str:
    return threading.current_thread().name


def test_size_bound_inline_and_off_loop() -> None:
    pool = Renderer(timeout_s=0.05, threads=1, max_prompt_chars=10_000)

    async def main() -> None:
        with pytest.raises(SluiceError) as e:
            await pool.tokenize(_thread, 10_001, "prompt")
        assert e.value.kind is ErrorKind.INVALID_ARG and e.value.param == "prompt" and "10000" in e.value.message
        assert await pool.tokenize(_thread, INLINE_CHARS, "prompt") == threading.current_thread().name
        assert (await pool.tokenize(_thread, INLINE_CHARS + 1, "prompt")).startswith("sluice-render-")
        assert (await pool.tokenize(_thread, 0, "tokens", work=INLINE_CHARS + 1)).startswith("sluice-render-")
        # No render deadline: work that outlasts timeout_s still answers.
        assert await pool.tokenize(lambda: threading.Event().wait(0.2), INLINE_CHARS + 1, "prompt") is False

    try:
        asyncio.run(main())
    finally:
        pool.close()


def test_a_busy_pool_refuses_with_retry_after() -> None:
    pool = Renderer(timeout_s=0.05, threads=1)
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
