"""Run the app under uvicorn (HTTP), with gRPC on the same event loop, and drain on SIGTERM.

uvicorn, told to exit, stops accepting connections at once and gives in-flight
requests `timeout_graceful_shutdown` seconds. A gateway behind a load balancer
needs more: SIGTERM starts a drain instead (`gateway.drain`). The listening
socket stays open; new requests get 503 with Retry-After and `/health` 503,
while running requests and streams go on for up to `drain_timeout_s`. Streams
still running at the deadline end with an error event. Then uvicorn is told to
exit, and the process exits 0. A second SIGTERM, or SIGINT, skips the drain.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import socket
from types import FrameType
from typing import Any

import uvicorn

from gateway import logs
from gateway.app_state import AppState
from gateway.drain import shutting_down
from gateway.frontends.supervisor import STARTUP_FAILED, frontend_env
from gateway.http.app import create_app
from gateway.http.budgets import listen_backlog, raise_fd_limit
from gateway.http.connections import ConnectionLimits, per_process
from gateway.http.protocol import build_protocol
from gateway.llm.local import LLMSpec
from gateway.settings import Settings

log = logging.getLogger("sluice.server")
# After the deadline, how long interrupted streams get to send their error event and close.
_AFTER_DEADLINE_S = 5.0


def run(settings: Settings, llm_specs: list[LLMSpec] | None = None) -> int:
    """Serve until told to stop; the exit status (`STARTUP_FAILED` when start-up failed)."""
    level = settings.log_level
    logs.configure(level, settings.log_format)
    app = create_app(settings, llm_specs)
    # uvicorn's own access log prints query strings; ours logs sizes only.
    # uvicorn trusts X-Forwarded-For from 127.0.0.1 (or $FORWARDED_ALLOW_IPS) unless told otherwise:
    # here only the proxies named by --forwarded-allow-ips are trusted, none by default. No
    # `limit_concurrency`: it counts open connections, so idle sockets would take requests' places.
    # Requests are bounded by the middleware (503 in the route's protocol), idle connections and
    # headers by the protocol (gateway.http.protocol). No WebSocket: no route speaks it.
    trusted = settings.forwarded_ips()
    config = uvicorn.Config(app, host=settings.host, port=settings.http_port, log_level=level, access_log=False,
                            timeout_graceful_shutdown=10, proxy_headers=bool(trusted),
                            forwarded_allow_ips=trusted or None, ws="none",
                            http=build_protocol(connection_limits(settings), app.state.sluice.registry,
                                                raise_fd_limit()),
                            # uvicorn's own keep-alive timer a second later: ours closes and counts.
                            timeout_keep_alive=math.ceil(settings.keep_alive_timeout_s) + 1,
                            log_config=logs.uvicorn_log_config(settings.log_format),
                            backlog=listen_backlog())
    frontend = frontend_env() is not None
    server = DrainingServer(config, app.state.sluice, settings.drain_timeout_s, frontend)
    try:
        # A frontend (gateway.frontends.supervisor) shares the port; uvicorn listens on the socket after start-up.
        server.run(sockets=[shared_socket(settings.host, settings.http_port)] if frontend else None)
    except OSError as e:  # the port could not be bound
        log.error("cannot listen on %s:%d: %s", settings.host, settings.http_port, e)
        return STARTUP_FAILED
    except SystemExit as e:  # uvicorn's, when the lifespan's start-up failed (or was stopped by a signal)
        if server.stopped_while_starting:
            return 0
        return STARTUP_FAILED if e.code == STARTUP_FAILED else 1
    return 0


def connection_limits(settings: Settings) -> ConnectionLimits:
    """This process's connection bounds: its share under `--frontends N`, within its fd limit."""
    limits = ConnectionLimits(settings.header_timeout_s, settings.max_header_bytes, settings.max_header_count,
                              settings.max_idle_connections_per_client, settings.max_idle_connections,
                              settings.stream_write_timeout_s, settings.max_stream_buffer_bytes,
                              settings.body_timeout_s, settings.max_fresh_connections,
                              settings.keep_alive_timeout_s)
    return per_process(limits, settings.frontends, raise_fd_limit())


def shared_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound with SO_REUSEPORT and not yet listening: until it listens, the kernel
    sends its connections to the frontends that do."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio binds it
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.setblocking(False)
    return sock


async def drain(state: AppState, timeout_s: float) -> None:
    """Refuse new requests, wait for those in flight, interrupt what is left at the deadline."""
    state.drain.begin()
    log.info("draining: %d request(s) in flight, deadline %.0f s", state.drain.in_flight, timeout_s)
    if await state.drain.wait_idle(timeout_s):
        log.info("drained: no request in flight")
        return
    ended = await state.llm.interrupt_all(shutting_down())
    log.warning("drain deadline passed: ended %d LLM request(s) with an error, %d request(s) in flight",
                ended, state.drain.in_flight)
    await state.drain.wait_idle(_AFTER_DEADLINE_S)


class DrainingServer(uvicorn.Server):
    """uvicorn, with SIGTERM turned into a drain followed by a normal exit."""

    def __init__(self, config: uvicorn.Config, state: AppState, drain_timeout_s: float,
                 frontend: bool = False) -> None:
        super().__init__(config)
        self._state = state
        self._drain_timeout_s = drain_timeout_s
        self._frontend = frontend
        self.stopped_while_starting = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.started and self._loop is not None:
            # Still starting (a frontend loads before it listens): stop the start-up, not a drain.
            self.stopped_while_starting = True
            startup = self._state.startup_task
            if startup is not None:
                self._loop.call_soon_threadsafe(startup.cancel)
            super().handle_exit(sig, frame)
            return
        if sig == signal.SIGTERM and self._frontend and self._draining is not None:
            return  # one drain: SIGTERM may come from the supervisor and from a kill of the whole group
        if sig == signal.SIGTERM and self._loop is not None and not self.should_exit and self._draining is None:
            # A signal handler runs between bytecodes of the loop's own thread: schedule, do not run.
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        if self._draining is None:
            self._draining = asyncio.create_task(self._drain_then_exit(), name="sluice-drain")

    async def _drain_then_exit(self) -> None:
        try:
            await drain(self._state, self._drain_timeout_s)
        except Exception:  # the process must still exit
            log.exception("drain failed")
        finally:
            self.should_exit = True
