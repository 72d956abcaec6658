"""Two routers sharing one real redis-server: affinity across replicas, outage, resync."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import pytest
import redis

from router import Router, RouterConfig, WorkerInfo
from router.replicas.redis_state import RedisSharedState, RedisStateConfig
from tests.servers import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed (make apt)"),
]

PROMPT = list(range(1, 41))  # 10 blocks of 4


class RedisServer:
    """A throw-away redis-server on loopback without persistence (a restart comes back empty)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        for _ in range(200):  # bounded wait for readiness
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited at start-up")
            time.sleep(0.025)
        raise RuntimeError("redis-server did not become ready")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


@pytest.fixture
def redis_server():
    srv = RedisServer()
    srv.start()
    yield srv
    srv.kill()


def make_replica(url: str, name: str) -> tuple[Router, RedisSharedState]:
    shared = RedisSharedState(RedisStateConfig(url=url, replica_id=name, load_interval_s=0.05,
                                               reconnect_min_s=0.05, reconnect_max_s=0.2,
                                               read_block_ms=100, socket_timeout_s=1.0))
    r = Router(RouterConfig(speculative_ttl_s=300, health_interval_s=600, scrape_interval_s=0), shared=shared)
    for w in ("w0", "w1"):
        r.add_worker(WorkerInfo(w, "http://127.0.0.1:1", ("m",), block_size=4))
    return r, shared


async def until(cond, what: str) -> None:
    for _ in range(1000):  # bounded: ~10 s at most
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def route(r: Router, rid: str, tokens: list[int], finish: bool = True) -> str:
    rk = r.rank("m", tokens)
    r.on_dispatch(rid, rk, rk.best.worker)
    if finish:
        r.on_finish(rid)
    return rk.best.worker


async def test_prefix_seen_on_a_routes_to_the_same_worker_on_b(redis_server):
    a, sa = make_replica(redis_server.url, "A")
    b, sb = make_replica(redis_server.url, "B")
    await a.start()
    await b.start()
    try:
        await until(lambda: sa.connected and sb.connected, "both connected")
        for i in range(6):  # several conversations, so both workers hold some
            home = route(a, f"a{i}", PROMPT + [100 + i] * 8)
            cont = PROMPT + [100 + i] * 8 + [5] * 3
            await until(lambda cont=cont: b.rank("m", cont).best.predicted_cached_tokens == 48, f"B learns conv {i}")
            assert b.rank("m", cont).best.worker == home

        # Load is shared too: A's in-flight requests on w0 steer B's least_load choice.
        for i in range(3):
            rk = a.rank("m", [7] * 8)
            a.on_dispatch(f"busy{i}", rk, "w0")
        await until(lambda: b.rank("m", [9] * 8, policy="least_load").best.worker == "w1", "B sees A's load")
        for i in range(3):
            a.on_finish(f"busy{i}")
    finally:
        await a.stop()
        await b.stop()


async def test_outage_keeps_local_routing_and_resyncs(redis_server):
    a, sa = make_replica(redis_server.url, "A")
    b, sb = make_replica(redis_server.url, "B")
    await a.start()
    await b.start()
    try:
        await until(lambda: sa.connected and sb.connected, "both connected")
        before = route(a, "r0", PROMPT)
        await until(lambda: b.rank("m", [*PROMPT, 1]).best.predicted_cached_tokens == 40, "B learns r0")

        redis_server.kill()
        await until(lambda: not sa.connected and not sb.connected, "both notice the outage")
        assert a.rank("m", [*PROMPT, 1]).best.worker == before  # local view intact
        other = [999] * 12 + [3] * 8
        during = route(a, "r1", other)  # routing goes on; the store waits in the outbox
        assert b.rank("m", [*other, 1]).best.predicted_cached_tokens == 0

        redis_server.start()  # comes back empty: no persistence
        resyncs = (sa.resyncs, sb.resyncs)
        await until(lambda: sa.resyncs > resyncs[0] and sb.resyncs > resyncs[1], "both resync")
        await until(lambda: b.rank("m", [*other, 1]).best.predicted_cached_tokens == 20, "B learns r1")
        assert b.rank("m", [*other, 1]).best.worker == during
        assert b.rank("m", [*PROMPT, 1]).best.worker == before  # B's own view survived too
        # A replica joining now learns r0 only from the snapshot the others pushed
        # into the restarted, empty Redis (r0's stream entry died with the old one).
        c, sc = make_replica(redis_server.url, "C")
        await c.start()
        try:
            await until(lambda: sc.resyncs == 1, "C synced")
            assert c.rank("m", [*PROMPT, 1]).best.worker == before
            assert c.rank("m", [*PROMPT, 1]).best.predicted_cached_tokens == 40
        finally:
            await c.stop()
    finally:
        await a.stop()
        await b.stop()
