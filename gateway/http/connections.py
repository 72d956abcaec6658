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

import functools
import ipaddress
import logging
import math
import os
import resource
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
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
    max_fresh_total: int = 16384  # connections that have not sent a request yet (`FreshConnections`)

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


def raise_fd_limit() -> int:
    """Raise the soft fd limit to the hard one (capped); returns the soft limit now in force (logged)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _FD_CAP if hard == resource.RLIM_INFINITY else min(hard, _FD_CAP)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return _FD_CAP if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:
        log.warning("fd limit stays at %d (raising it to the hard limit %d failed: %s)", soft, hard, e)
        return soft
    log.info("fd limit raised from %d to %d (the hard limit)", soft, target)
    return target


# Sizing the in-flight cap (--max-inflight-requests, default derived): each stream holds a client
# socket and a worker socket; some fds stay for everything else (listeners, Redis, KV-event
# subscribers, model files, logs). Memory: half the machine's (or cgroup's) for streams, at a
# budget per stream 4x the 64 KiB a stream is meant to cost. Never below MIN_INFLIGHT streams.
STREAM_FDS = 2
FD_RESERVE = 256
STREAM_MEMORY_BUDGET = 256 * 1024
MIN_INFLIGHT = 64


def derived_inflight(fd_limit: int, memory_bytes: int, processes: int = 1) -> int:
    """Requests in flight one of `processes` server processes can hold within its fds and its share of memory."""
    by_fds = (fd_limit - FD_RESERVE) // STREAM_FDS
    by_memory = memory_bytes // 2 // STREAM_MEMORY_BUDGET // max(1, processes)
    return max(MIN_INFLIGHT, min(by_fds, by_memory))


def memory_bytes() -> int:
    """The memory this process may use: the cgroup (v2) limit when it has one, else the machine's."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(text)) if text.isdigit() else total


@functools.cache
def inflight_limit(explicit: int | None, processes: int = 1) -> int:
    """--max-inflight-requests, else derived from the fd limit (raised first) and memory; logged (once)."""
    if explicit:
        return explicit
    fds, memory = raise_fd_limit(), memory_bytes()
    limit = derived_inflight(fds, memory, processes)
    log.info("in-flight requests capped at %d (fd limit %d: 2 per stream; memory %d MiB)", limit, fds,
             memory >> 20)
    return limit


def listen_backlog() -> int:
    """The listen backlog: the kernel's somaxconn (it clamps to it anyway), at least 4096, at most 65535,
    so a burst of connections waits in the kernel rather than being refused."""
    try:
        somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text().strip())
    except (OSError, ValueError):
        somaxconn = 4096
    return max(4096, min(somaxconn, 65535))


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
            biggest = next(iter(self._holding[self._most]))
            victim = next(iter(self._by_client[biggest]))
            self.discard(victim)
            self.on_evict("fresh_total")
            victim.close_idle()

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
                              "request ran, by reason (header_timeout, body_timeout, header_bytes, header_count, "
                              "idle_per_client, idle_total, fresh_total).", ["reason"], registry=registry)
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
