"""The idle-connection table, client keys and each process's share of the bounds
(gateway.http.connections); the real-socket behaviour is in test_connection_bounds.py."""

from __future__ import annotations

from gateway.http.connections import ConnectionLimits, IdleConnections, client_key, per_process


class _Conn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close_idle(self) -> None:
        self.closed = True


def test_oldest_idle_connection_of_the_client_is_closed_past_its_bound() -> None:
    reasons: list[str] = []
    idle = IdleConnections(per_client=2, total=100, on_evict=reasons.append)
    a, b, c, other = _Conn("a"), _Conn("b"), _Conn("c"), _Conn("other")
    for conn, client in ((a, "10.0.0.1"), (b, "10.0.0.1"), (other, "10.0.0.2"), (c, "10.0.0.1")):
        idle.add(conn, client)
    assert a.closed and not b.closed and not c.closed and not other.closed
    assert reasons == ["idle_per_client"] and idle.of("10.0.0.1") == 2 and len(idle) == 3


def test_busy_connections_do_not_count() -> None:
    idle = IdleConnections(per_client=1, total=1)
    busy, new = _Conn("busy"), _Conn("new")
    idle.add(busy, "10.0.0.1")
    idle.discard(busy)  # its request started
    idle.add(new, "10.0.0.1")
    assert not busy.closed and not new.closed and len(idle) == 1
    idle.discard(new)
    idle.discard(new)  # closing twice is harmless
    assert len(idle) == 0 and idle.of("10.0.0.1") == 0


def test_oldest_idle_connection_overall_is_closed_past_the_total() -> None:
    reasons: list[str] = []
    idle = IdleConnections(per_client=10, total=3, on_evict=reasons.append)
    conns = [_Conn(str(i)) for i in range(5)]
    for i, conn in enumerate(conns):
        idle.add(conn, f"10.0.0.{i}")
    assert [c.closed for c in conns] == [True, True, False, False, False]
    assert reasons == ["idle_total", "idle_total"] and len(idle) == 3


def test_client_keys_group_an_ipv6_host_by_its_64() -> None:
    assert client_key(("192.0.2.7", 5000)) == "192.0.2.7"
    assert client_key(("2001:db8:1:2:aaaa::1", 1)) == client_key(("2001:db8:1:2:bbbb::9", 2)) == "2001:db8:1:2::/64"
    assert client_key(("2001:db8:1:3::1", 1)) != client_key(("2001:db8:1:2::1", 1))
    assert client_key(("::ffff:192.0.2.7", 1)) == "192.0.2.7"
    assert client_key(None) == ""


def test_each_frontend_bounds_its_share_within_half_its_fd_limit() -> None:
    limits = ConnectionLimits(max_idle_per_client=256, max_idle_total=4096)
    assert per_process(limits, 1, 1_000_000).max_idle_total == 4096
    shared = per_process(limits, 3, 1_000_000)
    assert shared.max_idle_per_client == 86 and shared.max_idle_total == 1366
    assert per_process(limits, 1, 1024).max_idle_total == 512
