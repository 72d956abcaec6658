"""Connection bounds of the HTTP server: what the protocol layer (`gateway.http.protocol`) enforces
before, and independently of, the app.

Requests, not connections, count against the in-flight cap (`SluiceMiddleware`). A connection
with no request in progress is *idle* (opened and not yet sent its headers, or kept alive after a
response): idle connections are bounded per client address (IPv6: per /64, which one host
holds) and in total. Beyond either bound the oldest idle connection (of that client, or of all)
is closed, and the new one is kept: a flood of idle sockets recycles its own connections and
cannot lock out a client that arrives later. A connection with a request in progress (a stream
too) is never idle, so busy connections from one address are not capped here. With
`--frontends N` each process bounds its share (the bound / N, rounded up); the total stays under
half the process's fd limit, which is raised to its hard limit at start.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import resource
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("sluice.server")
_FD_CAP = 1 << 20  # the soft fd limit is raised to the hard one, up to this


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024  # request line + header names and values
    max_header_count: int = 100
    max_idle_per_client: int = 256
    max_idle_total: int = 4096
    write_timeout_s: float = 30.0  # a write that waited this long for the client: the connection is cut
    max_buffer_bytes: int = 1024 * 1024  # bytes queued for a client that stopped reading: cut
    body_timeout_s: float = 30.0  # the rest of a body answered before it was read (401, 429): dropped within it

    @property
    def stream_send_buffer(self) -> int:
        """SO_SNDBUF of a connection that streams: what the kernel may hold besides the transport."""
        return min(self.max_buffer_bytes, 256 * 1024)


def per_process(limits: ConnectionLimits, processes: int, fd_limit: int) -> ConnectionLimits:
    """Each of `processes` frontends' share of the idle bounds; the total under half the fd limit."""
    share = max(1, processes)
    total = min(math.ceil(limits.max_idle_total / share), max(1, fd_limit // 2))
    if total < math.ceil(limits.max_idle_total / share):
        log.warning("idle connections bounded at %d per process: half the fd limit (%d)", total, fd_limit)
    return ConnectionLimits(limits.header_timeout_s, limits.max_header_bytes, limits.max_header_count,
                            math.ceil(limits.max_idle_per_client / share), total,
                            limits.write_timeout_s, limits.max_buffer_bytes, limits.body_timeout_s)


def raise_fd_limit() -> int:
    """Raise the soft fd limit to the hard one (capped); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _FD_CAP if hard == resource.RLIM_INFINITY else min(hard, _FD_CAP)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return _FD_CAP if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target


def client_key(client: tuple[str, int] | None) -> str:
    """The address idle connections are counted by: the IPv4 address, or the IPv6 /64."""
    if client is None:
        return ""
    host = client[0]
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host.partition("%")[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(address) >> 64 << 64, 64)))


class Closable(Protocol):
    def close_idle(self) -> None: ...


class IdleConnections:
    """Idle connections by age, overall and per client; O(1) per change."""

    def __init__(self, per_client: int, total: int, on_evict: Callable[[str], None] = lambda reason: None) -> None:
        self.per_client = per_client
        self.total = total
        self.on_evict = on_evict
        self._all: OrderedDict[Closable, str] = OrderedDict()
        self._by_client: dict[str, OrderedDict[Closable, None]] = {}

    def __len__(self) -> int:
        return len(self._all)

    def of(self, client: str) -> int:
        return len(self._by_client.get(client, ()))

    def add(self, conn: Closable, client: str) -> None:
        """`conn` became idle; closes the oldest idle connections past the bounds."""
        if conn in self._all:
            return
        self._all[conn] = client
        mine = self._by_client.setdefault(client, OrderedDict())
        mine[conn] = None
        if len(mine) > self.per_client:
            self._evict(next(iter(mine)), "idle_per_client")
        if len(self._all) > self.total:
            self._evict(next(iter(self._all)), "idle_total")

    def discard(self, conn: Closable) -> None:
        """`conn` started a request, or closed."""
        client = self._all.pop(conn, None)
        if client is None:
            return
        mine = self._by_client[client]
        del mine[conn]
        if not mine:
            del self._by_client[client]

    def _evict(self, conn: Closable, reason: str) -> None:
        self.discard(conn)
        self.on_evict(reason)
        conn.close_idle()


class ConnectionMetrics:
    """Connections the protocol layer closed, by reason, and the idle connections now open."""

    def __init__(self, registry: CollectorRegistry | None, idle: IdleConnections) -> None:
        self.closed = Counter("sluice_http_connections_closed", "HTTP connections the server closed before a "
                              "request ran, by reason (header_timeout, body_timeout, header_bytes, header_count, "
                              "idle_per_client, idle_total).", ["reason"], registry=registry)
        self.slow_reader = slow_reader_counter(registry)
        gauge = Gauge("sluice_http_idle_connections", "HTTP connections open with no request in progress.",
                      registry=registry)
        gauge.set_function(lambda: len(idle))


_SLOW_READERS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def slow_reader_counter(registry: CollectorRegistry | None) -> Counter:
    """`sluice_stream_slow_reader_total{protocol, reason}`: responses and streams cut because the
    client stopped reading (reason write_timeout or buffer). One per registry, for every protocol."""
    if registry is None:
        return Counter("sluice_stream_slow_reader", "", ["protocol", "reason"], registry=None)
    counter = _SLOW_READERS.get(registry)
    if counter is None:
        counter = Counter("sluice_stream_slow_reader", "Responses and streams ended because the client did not "
                          "take a write within the write deadline (reason write_timeout) or left too many bytes "
                          "queued (reason buffer); the connection is closed and the engine request aborted.",
                          ["protocol", "reason"], registry=registry)
        _SLOW_READERS[registry] = counter
    return counter
