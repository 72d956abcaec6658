"""uvicorn's HTTP protocol with a bound on the time a client may take to send its headers.

uvicorn bounds idle keep-alive connections but not a request's header phase, so a client
that sends a header byte every few seconds holds a connection (and a slot of
`limit_concurrency`) for ever. This subclass closes a connection whose request headers
are not complete `header_timeout_s` after the connection opened or the request began.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class BoundedHeaderProtocol(HttpToolsProtocol):
    header_timeout_s: float = 10.0  # set per server by `protocol_with_header_timeout`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def protocol_with_header_timeout(header_timeout_s: float) -> type[BoundedHeaderProtocol]:
    return type("BoundedHeaderProtocol", (BoundedHeaderProtocol,), {"header_timeout_s": header_timeout_s})
