"""Two routers sharing state as two frontends of one node do (router.replicas.node_state): real Unix
sockets in a private directory, one event loop. Affinity, load and what the cost learned cross
from one to the other; a sibling that goes silent stops counting."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from router import Router, RouterConfig, WorkerInfo
from router.cost import TtftFeatures
from router.replicas.node_state import NodeSharedState, NodeStateConfig
from router.state import RouterState
from tests.router.replicas.test_redis_state import PROMPT, route, until


def make_frontend(directory: Path, index: int, **timing: Any) -> tuple[Router, NodeSharedState]:
    shared = NodeSharedState(NodeStateConfig(directory, index, 2, interval_s=0.01, heartbeat_s=0.05,
                                             learn_interval_s=0.05, **timing))
    r = Router(RouterConfig(speculative_ttl_s=300, health_interval_s=600, scrape_interval_s=0), shared=shared)
    for w in ("w0", "w1"):
        r.add_worker(WorkerInfo(w, "http://127.0.0.1:1", ("m",), block_size=4))
    return r, shared


def state(r: Router) -> RouterState:
    s = r.feed
    assert isinstance(s, RouterState)
    return s


@pytest.fixture
async def pair(tmp_path: Path):
    a, sa = make_frontend(tmp_path, 0, ttl_s=0.5)
    b, sb = make_frontend(tmp_path, 1, ttl_s=0.5)
    await a.start()
    await b.start()
    try:
        await until(lambda: sa.connected and sb.connected, "both frontends hear each other")
        yield a, b
    finally:
        await a.stop()
        await b.stop()


async def test_a_prefix_routed_by_one_frontend_keeps_its_worker_on_the_other(pair) -> None:
    a, b = pair
    for i in range(6):  # several conversations, so both workers hold some
        home = route(a, f"a{i}", PROMPT + [100 + i] * 8)
        turn = PROMPT + [100 + i] * 8 + [5] * 3
        await until(lambda turn=turn: b.rank("m", turn).best.predicted_cached_tokens == 48, f"B learns conv {i}")
        assert b.rank("m", turn).best.worker == home


async def test_load_placed_by_one_frontend_steers_the_others_choice(pair) -> None:
    a, b = pair
    for i in range(3):
        a.on_dispatch(f"busy{i}", a.rank("m", [7] * 8), "w0")
    await until(lambda: state(b).load.snapshot("w0", state(b).clock()).in_flight == 3, "B counts A's requests")
    for k in range(4):  # every choice B makes now avoids A's busy worker
        assert b.rank("m", [9 + k] * 8, policy="least_load").best.worker == "w1"
    for i in range(3):
        a.on_finish(f"busy{i}")
    await until(lambda: state(b).load.snapshot("w0", state(b).clock()).in_flight == 0, "B sees them finish")


async def test_what_one_frontend_learned_the_other_uses(pair) -> None:
    a, b = pair
    la, lb = state(a).learn, state(b).learn
    for i in range(40):  # A alone observes: TTFTs growing with the prompt, and 30-token answers
        f = TtftFeatures(running=0, tokens=100 * (i % 5 + 1), pairs=0)
        la.observe_ttft("w0", f, 0.01 + 1e-3 * f.tokens, 0.0)
        la.observe_answer("m", 30)
    before = lb.fleet
    await until(lambda: lb.fleet == la.fleet and lb.answer_tokens("m") == 30.0, "B fits A's observations")
    assert lb.fleet != before and lb.fleet.token_s == pytest.approx(1e-3, rel=0.2)
    assert lb.speed("w0") == pytest.approx(la.speed("w0"))


async def test_a_silent_frontends_load_stops_counting(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a, _ = make_frontend(tmp_path, 0, ttl_s=0.3)
    b, sb = make_frontend(tmp_path, 1, ttl_s=0.3)
    await a.start()
    await b.start()
    try:
        a.on_dispatch("busy", a.rank("m", [7] * 8), "w0")
        await until(lambda: state(b).load.snapshot("w0", state(b).clock()).in_flight == 1, "B counts A's request")
        with caplog.at_level(logging.WARNING, "router.replicas.node_state"):
            await a.stop()  # as a frontend that died: its request never finishes
            await until(lambda: state(b).load.snapshot("w0", state(b).clock()).in_flight == 0, "A's load expires")
        assert not sb.connected and "frontend 0 silent" in caplog.text
    finally:
        await a.stop()
        await b.stop()


async def test_a_sibling_that_stops_reading_is_cut_off_and_never_delays_the_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Frontend 2 accepts A's connection and never reads. A's frames to B keep coming on time (B
    never lets A's load expire meanwhile), and once the bytes waiting for frontend 2 pass the
    bound, A cuts it off (logged) instead of buffering for it without end."""
    import asyncio

    def frontend(index: int) -> tuple[Router, NodeSharedState]:
        shared = NodeSharedState(NodeStateConfig(tmp_path, index, 3, interval_s=0.01, heartbeat_s=0.05,
                                                 learn_interval_s=0.05, ttl_s=0.3,
                                                 max_buffered_bytes=256 * 1024))
        r = Router(RouterConfig(speculative_ttl_s=300, health_interval_s=600, scrape_interval_s=0), shared=shared)
        for w in ("w0", "w1"):
            r.add_worker(WorkerInfo(w, "http://127.0.0.1:1", ("m",), block_size=4))
        return r, shared

    held: list[asyncio.StreamWriter] = []

    async def never_reads(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    stalled = await asyncio.start_unix_server(never_reads, str(tmp_path / "routing-2.sock"))
    a, _ = frontend(0)
    b, _ = frontend(1)
    await a.start()
    await b.start()
    try:
        a.on_dispatch("busy", a.rank("m", [7] * 8), "w0")
        await until(lambda: state(b).load.snapshot("w0", state(b).clock()).in_flight == 1, "B counts A's request")
        await until(lambda: bool(held), "A connects to the stalled frontend")
        with caplog.at_level(logging.WARNING, "router.replicas.node_state"):
            for i in range(400):  # long prompts: each speculative store is kilobytes on the wire
                a.on_dispatch(f"c{i}", a.rank("m", [1000 + i] * 4096), "w1")
                a.on_finish(f"c{i}")
                assert state(b).load.snapshot("w0", state(b).clock()).in_flight == 1, "B let A's load expire"
                await asyncio.sleep(0.005)
            await until(lambda: "frontend 2 stopped taking the routing state" in caplog.text, "A cuts frontend 2 off")
        assert state(b).load.snapshot("w0", state(b).clock()).in_flight == 1
    finally:
        await a.stop()
        await b.stop()
        stalled.close()
        for writer in held:
            writer.transport.abort()
