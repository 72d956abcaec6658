"""What the server's fds and memory allow: the soft fd limit raised to the hard one, the in-flight
cap derived from both, the listen backlog, and one fd budget that connections without a request
in progress give way to (`FdBudget`).

Each open client connection holds an fd, and one with a request in progress holds a second as a
rule: its worker's socket. The fresh and kept-alive tables (`gateway.http.connections`) are each
bounded under half the fd limit, and the in-flight cap is sized for two fds a stream, so together
they could ask for more fds than there are: a flood of connections that send nothing, beside a
thousand streams, would make `accept` and the worker connects fail with EMFILE, and requests in
flight with them. So when a new connection brings the fds counted so (open connections, plus one
more for each busy one, plus `FD_RESERVE` for everything else) past the limit, the oldest fresh
connection of a client holding several is closed, else the oldest kept-alive one, else the
newcomer (reason `fd_budget` in `sluice_http_connections_closed_total`). Busy connections are
never closed here.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
from pathlib import Path

from gateway.http.connections import FreshConnections, IdleConnections

log = logging.getLogger("sluice.server")
_FD_CAP = 1 << 20  # the soft fd limit is raised to the hard one, up to this


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


class FdBudget:
    """Counts the server's open client connections; one event loop owns it."""

    def __init__(self, fd_limit: int, idle: IdleConnections, fresh: FreshConnections,
                 reserve: int = FD_RESERVE) -> None:
        self.fd_limit = fd_limit
        self.reserve = reserve
        self.idle, self.fresh = idle, fresh
        self.open = 0

    def fds(self) -> int:
        """The fds the open connections are counted to hold, and the reserve."""
        busy = max(0, self.open - len(self.fresh) - len(self.idle))
        return self.open + busy + self.reserve

    def opened(self) -> None:
        """A connection opened (and was added to the fresh table): make room past the budget."""
        self.open += 1
        if self.fds() <= self.fd_limit:
            return
        # A flood (some address holding several fresh connections) loses its oldest first; else the
        # oldest kept-alive connection goes, not the newcomer; with neither, the newcomer.
        if self.fresh.most > 1 or not self.idle.evict_oldest("fd_budget"):
            self.fresh.evict("fd_budget")

    def closed(self) -> None:
        self.open = max(0, self.open - 1)
