"""Background tasks of the classic path that are logged and restarted when they die.

`supervise(name, run, on_crash)` runs `run()` until it returns or the task is
cancelled. When `run()` raises, the traceback is logged, `on_crash(exc)` is called
(the scheduler fails the requests the dead loop held, so none is left waiting),
and `run()` starts again after a short backoff that grows while crashes repeat, so
a loop that dies at once cannot spin. Cancellation is the only way to stop it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("sluice.classic")

_BACKOFF_S = (0.0, 0.01, 0.1, 1.0)  # before restart n (the last repeats)
_CALM_S = 10.0  # a run that lasted this long before dying starts the backoff over


async def supervise(name: str, run: Callable[[], Awaitable[None]],
                    on_crash: Callable[[BaseException], None] | None = None) -> None:
    loop = asyncio.get_running_loop()
    crashes = 0
    while True:
        started = loop.time()
        try:
            await run()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("background task %s died; restarting it", name)
            crashes = 1 if loop.time() - started > _CALM_S else crashes + 1
            if on_crash is not None:
                try:
                    on_crash(exc)
                except Exception:
                    log.exception("cleaning up after %s failed", name)
        await asyncio.sleep(_BACKOFF_S[min(crashes, len(_BACKOFF_S) - 1)])
