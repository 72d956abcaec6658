"""`--metrics-port`: the app's Prometheus registry on a port of its own.

A scraper then needs to reach only this port, not the API port (e.g. a NetworkPolicy that
opens 8000 to clients and 9400 to Prometheus alone). It serves the same registry as
`/metrics` on the API port, with the same `--metrics-require-key` rule, and nothing else.

It is a tiny HTTP/1.0-style server on the gateway's own event loop (asyncio streams), not a
thread: some collectors read the router's state, which belongs to that loop. Each connection
sends one request (headers bounded in size and time) and gets one response, then is closed.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from engines.errors import ErrorKind, SluiceError
from gateway.frontends.channel import Peers, exposition
from gateway.security.access import Access
from gateway.security.guard import Security

log = logging.getLogger("sluice.metrics")
_MAX_HEAD_BYTES = 16 * 1024
_HEAD_TIMEOUT_S = 10.0


class MetricsServer:
    def __init__(self, registry: CollectorRegistry, security: Security, host: str, port: int,
                 peers: Peers | None = None) -> None:
        self._registry, self._security, self._peers = registry, security, peers
        self._host, self._port = host, port
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (the configured one, or the kernel's choice for 0)."""
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        # Frontends of `--frontends N` share the port, as they share the API port.
        self._server = await asyncio.start_server(self._serve, self._host, self._port,
                                                  limit=_MAX_HEAD_BYTES, reuse_port=self._peers is not None)
        log.info("metrics on port %d (/metrics)", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            status, headers, body = self._answer(head.decode("latin-1"))
            if body is None:  # allowed: read the exposition (it may ask sibling frontends)
                body, headers["Content-Type"] = await exposition(self._registry, self._peers, headers.pop("Accept"))
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Connection: close",
                 *(f"{k}: {v}" for k, v in headers.items())]
        try:
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _answer(self, head: str) -> tuple[str, dict[str, str], bytes | None]:
        """Status, headers and body; body None: the exposition, once the request passed the checks (the
        headers then hold the scraper's Accept, which chooses between OpenMetrics and Prometheus text)."""
        request_line, *header_lines = head.split("\r\n")
        method, _, rest = request_line.partition(" ")
        path = rest.partition(" ")[0].partition("?")[0]
        if path != "/metrics":
            return "404 Not Found", {"Content-Type": "text/plain"}, b"only /metrics is served here\n"
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", {"Allow": "GET, HEAD"}, b""
        fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
        auth = fields.get("authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        try:
            self._security.authenticate(Access.METRICS, token, local=False)
        except SluiceError as e:
            if e.kind is ErrorKind.PERMISSION_DENIED:  # a key without the metrics scope
                return "403 Forbidden", {"Content-Type": "text/plain"}, (e.message + "\n").encode()
            return "401 Unauthorized", {"WWW-Authenticate": "Bearer", "Content-Type": "text/plain"}, \
                (e.message + "\n").encode()
        if method == "HEAD":
            return "200 OK", {"Content-Type": choose_encoder(fields.get("accept", ""))[1]}, b""
        return "200 OK", {"Accept": fields.get("accept", "")}, None  # the scraper's, to choose the format
