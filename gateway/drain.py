"""Draining: finish what is in flight, refuse what is new, then let the server exit.

On SIGTERM (`gateway.http.server`) the gateway keeps its listening socket and its
keep-alive connections open, so that a client or load balancer that has not
noticed yet gets an answer rather than a refused connection: every new request
is answered 503 with `Retry-After` and `Connection: close` in its route's
protocol (OpenAI or KServe), and `/health` answers 503, while the requests
already running (streams included) go on. `Drain` counts them; the server exits
once none is left, or at the deadline.

`gateway.http.middleware.DrainMiddleware` counts and refuses; it lets `/health` and
`/metrics` through, so probes and scrapes keep working during the drain.
"""

from __future__ import annotations

import asyncio

from engines.errors import ErrorKind, SluiceError

RETRY_AFTER_S = 1.0  # a draining replica's clients should retry on another one at once


def shutting_down() -> SluiceError:
    return SluiceError("The server is shutting down; retry the request (another replica will take it).",
                       ErrorKind.UNAVAILABLE, code="shutting_down", retryable=True, retry_after_s=RETRY_AFTER_S)


class Drain:
    """In-flight HTTP requests and the draining flag of one app; one event loop."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self._idle: asyncio.Event | None = None

    def begin(self) -> None:
        self.draining = True

    def enter(self) -> None:
        self.in_flight += 1

    def exit(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once no request is in flight, False if `timeout_s` passed first."""
        if self.in_flight == 0:
            return True
        self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return self.in_flight == 0
        finally:
            self._idle = None
        return True
