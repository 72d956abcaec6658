"""The derived in-flight cap (fds: 2 per stream; memory) and the listen backlog."""

from __future__ import annotations

import logging
import resource

import pytest

from gateway.http.budgets import (
    FD_RESERVE,
    MIN_INFLIGHT,
    derived_inflight,
    inflight_limit,
    listen_backlog,
    memory_bytes,
    raise_fd_limit,
)

GIB = 1 << 30


def test_the_fd_limit_bounds_streams_at_two_fds_each() -> None:
    assert derived_inflight(1024, 64 * GIB) == (1024 - FD_RESERVE) // 2
    assert derived_inflight(1 << 20, 64 * GIB) == 64 * GIB // 2 // (256 * 1024)  # then memory binds


def test_a_common_host_is_sized_for_ten_thousand_streams_and_more() -> None:
    assert derived_inflight(65536, 8 * GIB) >= 10_000
    assert derived_inflight(1 << 20, 16 * GIB) > derived_inflight(65536, 8 * GIB)
    assert derived_inflight(1 << 20, 16 * GIB, processes=2) == derived_inflight(1 << 20, 8 * GIB)


def test_never_below_the_floor() -> None:
    assert derived_inflight(300, GIB) == MIN_INFLIGHT


def test_an_explicit_cap_wins_and_the_derived_one_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    assert inflight_limit(77) == 77
    inflight_limit.cache_clear()  # derived once per process
    with caplog.at_level(logging.INFO, logger="sluice.server"):
        derived = inflight_limit(None)
    assert derived == derived_inflight(raise_fd_limit(), memory_bytes(), 1)
    assert f"in-flight requests capped at {derived}" in caplog.text


def test_the_soft_fd_limit_is_raised_to_the_hard_one_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 1024:
        pytest.skip("needs a finite hard fd limit above 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        with caplog.at_level(logging.INFO, logger="sluice.server"):
            assert raise_fd_limit() == min(hard, 1 << 20)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == min(hard, 1 << 20)
        assert f"fd limit raised from 1024 to {min(hard, 1 << 20)}" in caplog.text
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_backlog_takes_bursts() -> None:
    assert 4096 <= listen_backlog() <= 65535



class _Conn:
    def __init__(self) -> None:
        self.closed = False

    def close_idle(self) -> None:
        self.closed = True


class _Server:
    """The tables and the budget as the protocol drives them (connection_made: fresh, then opened)."""

    def __init__(self, fd_limit: int, reserve: int) -> None:
        from gateway.http.budgets import FdBudget
        from gateway.http.connections import FreshConnections, IdleConnections

        self.reasons: list[str] = []
        self.idle = IdleConnections(100, 100, self.reasons.append)
        self.fresh = FreshConnections(100, self.reasons.append)
        self.budget = FdBudget(fd_limit, self.idle, self.fresh, reserve)

    def open(self, client: str) -> _Conn:
        conn = _Conn()
        self.fresh.add(conn, client)
        self.budget.opened()
        return conn

    def begin(self, conn: _Conn) -> None:  # its request's headers are complete
        self.fresh.discard(conn)

    def keep(self, conn: _Conn, client: str) -> None:  # answered, kept alive
        self.idle.add(conn, client)


def test_connections_without_a_request_give_way_before_the_streams_run_out_of_fds() -> None:
    """Each table alone is under its bound; with the busy connections (two fds each) they would
    pass the fd limit: the flood's oldest fresh connection goes; busy connections never do."""
    s = _Server(fd_limit=30, reserve=10)
    busy = [s.open("10.0.0.9") for _ in range(5)]
    for conn in busy:
        s.begin(conn)  # 5 streams: 10 fds with their workers' sockets
    flood = [s.open("10.0.0.1") for _ in range(6)]
    others = [s.open("10.0.0.2"), s.open("10.0.0.3"), s.open("10.0.0.4"), s.open("10.0.0.5")]
    assert s.budget.fds() == 30 and s.reasons == []
    s.open("10.0.0.6")  # 31 past 30: the flood's oldest goes, not the newcomer nor the others
    assert s.reasons == ["fd_budget"] and flood[0].closed
    assert not any(c.closed for c in (*flood[1:], *others, *busy))


def test_with_no_flood_the_oldest_kept_alive_connection_gives_way_then_the_newcomer() -> None:
    s = _Server(fd_limit=13, reserve=10)
    first, second = s.open("10.0.0.1"), s.open("10.0.0.2")
    for conn, client in ((first, "10.0.0.1"), (second, "10.0.0.2")):
        s.begin(conn)
        s.keep(conn, client)
    lone = s.open("10.0.0.3")  # 13 fds: within the budget
    newcomer = s.open("10.0.0.4")  # 14: no client holds two fresh ones, so the oldest kept-alive goes
    assert first.closed and not second.closed and not lone.closed and not newcomer.closed
    s.idle.discard(first)
    s.budget.closed()
    s.idle.discard(second)  # the other kept-alive one starts a request (busy: two fds)
    s.open("10.0.0.5")  # 4 open, 1 busy, 10: 15 > 13 and nothing kept alive: the oldest fresh one goes
    assert s.reasons == ["fd_budget", "fd_budget"] and lone.closed and not second.closed
