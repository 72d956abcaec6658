"""The kept-alive and fresh connection tables, client keys and each process's share of the bounds
(gateway.http.connections); the real-socket behaviour is in test_connection_bounds.py and
tests/integration/test_connection_burst.py."""

from __future__ import annotations

import random

from gateway.http.connections import ConnectionLimits, FreshConnections, IdleConnections, client_key, per_process


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
    fresh = ConnectionLimits(max_fresh_total=16384)
    assert per_process(fresh, 2, 1_000_000).max_fresh_total == 8192
    assert per_process(fresh, 1, 20_000).max_fresh_total == 10_000


def test_a_burst_of_fresh_connections_from_one_address_is_kept_whole() -> None:
    fresh = FreshConnections(total=5000)
    burst = [_Conn(str(i)) for i in range(4000)]  # a load balancer's burst, far past the kept-alive bound
    for conn in burst:
        fresh.add(conn, "10.0.0.1")
    assert not any(c.closed for c in burst) and fresh.of("10.0.0.1") == 4000
    for conn in burst:
        fresh.discard(conn)  # each sent its headers
    assert len(fresh) == 0 and fresh.of("10.0.0.1") == 0


def test_past_the_total_a_flood_loses_its_own_oldest_connections() -> None:
    reasons: list[str] = []
    fresh = FreshConnections(total=10, on_evict=reasons.append)
    others = [_Conn(f"b{i}") for i in range(3)] + [_Conn("c")]
    for conn in others[:3]:
        fresh.add(conn, "10.0.0.2")
    fresh.add(others[3], "10.0.0.3")
    flood = [_Conn(f"a{i}") for i in range(50)]
    for conn in flood:
        fresh.add(conn, "10.0.0.1")  # 6 may stay; the flood then recycles its own, oldest first
    assert not any(c.closed for c in others)
    assert [c.closed for c in flood] == [True] * 44 + [False] * 6
    assert reasons == ["fresh_total"] * 44 and len(fresh) == 10
    # Its connections gone, the next biggest holder is the one to lose its oldest.
    for conn in flood[44:]:
        fresh.discard(conn)
    for i in range(7):
        fresh.add(_Conn(f"d{i}"), f"10.0.1.{i}")
    assert others[0].closed and not any(c.closed for c in others[1:])


def test_the_biggest_holder_is_found_whatever_the_order_of_changes() -> None:
    rng = random.Random(7)
    evicted: list[tuple[str, int]] = []
    fresh = FreshConnections(total=40)
    held: dict[str, list[_Conn]] = {}  # the model: each client's fresh connections, oldest first

    def add(conn: _Conn, client: str) -> None:
        counts = {c: len(v) for c, v in held.items() if v}
        counts[client] = counts.get(client, 0) + 1
        held.setdefault(client, []).append(conn)
        fresh.add(conn, client)
        if sum(counts.values()) > 40:
            victim = next(c for v in held.values() for c in v if c.closed)
            owner = next(k for k, v in held.items() if victim in v)
            assert held[owner][0] is victim and counts[owner] == max(counts.values())
            held[owner].remove(victim)
            evicted.append((owner, counts[owner]))

    for step in range(5000):
        client = f"10.0.0.{min(int(rng.expovariate(0.5)), 9)}"
        if rng.random() < 0.55:
            add(_Conn(str(step)), client)
        elif held.get(client):
            fresh.discard(held[client].pop(rng.randrange(len(held[client]))))
        assert len(fresh) == sum(map(len, held.values())) <= 40
    assert len(evicted) > 100
