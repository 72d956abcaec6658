"""Connection bounds of the HTTP server: what the protocol layer (`gateway.http.protocol`) enforces
before, and independently of, the app.

Requests, not connections, count against the in-flight cap (`SluiceMiddleware`). A connection
with no request in progress is one of two kinds, bounded apart:

- *Kept alive* (answered, waiting for its next request): bounded per client address (IPv6: per
  /64, which one host holds) and in total. Beyond either bound the oldest kept-alive connection
  (of that client, or of all) is closed, and the new one is kept (`IdleConnections`).
- *Fresh* (opened, first request's headers not yet complete): each lives at most the header
  timeout, and they are bounded in total, not per address, so that a burst of thousands from one
  address (a load balancer, a NAT, a benchmark) is served whole. Beyond the total, the oldest fresh
  connection of the address holding the most is closed: a flood from one address (slowloris)
  recycles its own connections and cannot close those of a client holding fewer
  (`FreshConnections`).

A connection with a request in progress (a stream too) is neither, so busy connections from one
address are not capped here. With `--frontends N` each process bounds its share (the bound / N,
rounded up); each total stays under half the process's fd limit, which is raised to its hard
limit at start.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("sluice.server")


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
    max_fresh_total: int = 16384  # connections that have not sent a request yet (`FreshConnections`)
    keep_alive_timeout_s: float = 75.0  # a kept-alive connection idle this long is closed

    @property
    def stream_send_buffer(self) -> int:
        """SO_SNDBUF of a connection that streams: what the kernel may hold besides the transport."""
        return min(self.max_buffer_bytes, 256 * 1024)


def per_process(limits: ConnectionLimits, processes: int, fd_limit: int) -> ConnectionLimits:
    """Each of `processes` frontends' share of the connection bounds; each total under half the fd limit."""
    share = max(1, processes)

    cap = max(1, fd_limit // 2)

    def total(bound: int, what: str) -> int:
        mine = math.ceil(bound / share)
        if mine > cap:
            log.info("%s connections bounded at %d per process: half the fd limit (%d)", what, cap, fd_limit)
        return min(mine, cap)

    return replace(limits, max_idle_per_client=math.ceil(limits.max_idle_per_client / share),
                   max_idle_total=total(limits.max_idle_total, "idle"),
                   max_fresh_total=total(limits.max_fresh_total, "fresh"))


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
    """Kept-alive connections by age, overall and per client; O(1) per change."""

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

    def evict_oldest(self, reason: str) -> bool:
        """Close the oldest kept-alive connection; False if none."""
        if not self._all:
            return False
        self._evict(next(iter(self._all)), reason)
        return True

    def _evict(self, conn: Closable, reason: str) -> None:
        self.discard(conn)
        self.on_evict(reason)
        conn.close_idle()


class FreshConnections:
    """Connections that have not sent their first request's headers, by client and age; O(1) per change.

    No bound per client. Past `total`, the oldest fresh connection of the client that holds the
    most is closed: whoever floods loses its own connections first."""

    def __init__(self, total: int, on_evict: Callable[[str], None] = lambda reason: None) -> None:
        self.total = total
        self.on_evict = on_evict
        self._client_of: dict[Closable, str] = {}
        self._by_client: dict[str, OrderedDict[Closable, None]] = {}
        self._holding: dict[int, dict[str, None]] = {}  # n -> the clients that hold n fresh connections
        self._most = 0  # the largest n held

    def __len__(self) -> int:
        return len(self._client_of)

    def of(self, client: str) -> int:
        return len(self._by_client.get(client, ()))

    def add(self, conn: Closable, client: str) -> None:
        """`conn` opened; past the total, closes the oldest fresh connection of the biggest holder."""
        if conn in self._client_of:
            return
        self._client_of[conn] = client
        mine = self._by_client.setdefault(client, OrderedDict())
        mine[conn] = None
        self._count(client, len(mine) - 1, len(mine))
        if len(self._client_of) > self.total:
            self.evict("fresh_total")

    @property
    def most(self) -> int:
        """The most fresh connections one client holds."""
        return self._most

    def evict(self, reason: str) -> bool:
        """Close the oldest fresh connection of the client that holds the most; False if none."""
        if not self._most:
            return False
        victim = next(iter(self._by_client[next(iter(self._holding[self._most]))]))
        self.discard(victim)
        self.on_evict(reason)
        victim.close_idle()
        return True

    def discard(self, conn: Closable) -> None:
        """`conn`'s first request's headers are complete, or it closed."""
        client = self._client_of.pop(conn, None)
        if client is None:
            return
        mine = self._by_client[client]
        del mine[conn]
        self._count(client, len(mine) + 1, len(mine))
        if not mine:
            del self._by_client[client]

    def _count(self, client: str, before: int, after: int) -> None:
        """`client` held `before` fresh connections and now holds `after` (one more or one less)."""
        if before:
            holders = self._holding[before]
            del holders[client]
            if not holders:
                del self._holding[before]
        if after:
            self._holding.setdefault(after, {})[client] = None
        if after > self._most or (before == self._most and before not in self._holding):
            self._most = after


class ConnectionMetrics:
    """Connections the protocol layer closed, by reason, and the idle (and fresh) connections now open."""

    def __init__(self, registry: CollectorRegistry | None, idle: IdleConnections, fresh: FreshConnections) -> None:
        self.closed = Counter("sluice_http_connections_closed", "HTTP connections the server closed before a "
                              "request ran, by reason (header_timeout, keep_alive, body_timeout, header_bytes, "
                              "header_count, idle_per_client, idle_total, fresh_total, fd_budget).", ["reason"],
                              registry=registry)
        self.slow_reader = slow_reader_counter(registry)
        gauge = Gauge("sluice_http_idle_connections", "HTTP connections open with no request in progress "
                      "(kept alive, or fresh: not yet sent a request).", registry=registry)
        gauge.set_function(lambda: len(idle) + len(fresh))
        gauge = Gauge("sluice_http_fresh_connections", "HTTP connections open that have not yet sent their "
                      "first request's headers.", registry=registry)
        gauge.set_function(lambda: len(fresh))


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
