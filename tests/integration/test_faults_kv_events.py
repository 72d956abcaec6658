"""A misbehaving KV-event publisher against a real gateway: the subscriber survives it all.

The publisher is the vLLM publisher STAND-IN (tests/standins/vllm_kv_publisher.py) on real
ZMQ sockets: a real vLLM cannot be made to send malformed batches, skip sequence numbers
or restart its count on demand. The worker's HTTP side is the TensorRT-LLM STAND-IN
(tests/standins/trtllm_standin.py), registered with the publisher's endpoints; it only
answers /health and /v1/models here. The gateway is a real `sluice serve` process.

Each continuity loss (a malformed message, an unfillable gap, a sequence that went back)
must drop the worker's exact index entries, be counted by reason, and leave the
subscriber running so the next good batches rebuild the index.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio

from engines.weights import resolve_llm
from tests.integration.vllm_support import free_port_pair, stop_process, wait_healthy
from tests.router.index import eventgen as g
from tests.servers import ROOT, Server, free_port, metric_value, start_server
from tests.standins.vllm_kv_publisher import VllmPublisherStandIn

pytestmark = pytest.mark.integration

MODEL = "standin-model"
WORKER = "kv-w"
BS = 4
TOKENS = list(range(1, 17))  # 4 blocks of 4


class Setup:
    def __init__(self, gateway: Server, events: str, replay: str) -> None:
        self.gateway, self.events, self.replay = gateway, events, replay


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("kv")
    model_dir = resolve_llm("smollm2-135m-instruct", ROOT / "model_repository")
    port = free_port()
    env = dict(os.environ, SLUICE_TRTLLM_SERVE=f"{sys.executable} {ROOT / 'tests' / 'standins' / 'trtllm_standin.py'}")
    worker = subprocess.Popen(
        [sys.executable, "-m", "engines.launchers", "--engine", "trtllm", "--model", str(model_dir),
         "--served-model-name", MODEL, "--port", str(port)], cwd=ROOT, env=env, start_new_session=True)
    (tmp / "repo").mkdir()
    gateway = None
    try:
        wait_healthy(f"http://127.0.0.1:{port}", worker, timeout_s=60)
        gateway = start_server(["--model-repository", str(tmp / "repo")], tmp / "gateway.log")
        kv_port = free_port_pair()
        events, replay = f"tcp://127.0.0.1:{kv_port}", f"tcp://127.0.0.1:{kv_port + 1}"
        r = httpx.post(gateway.url + "/v1/admin/workers", timeout=30, json={
            "name": WORKER, "url": f"http://127.0.0.1:{port}", "engine": "trtllm", "models": [MODEL],
            "tokenizer": str(model_dir), "block_size": BS, "kv_events_endpoint": events,
            "kv_events_replay_endpoint": replay})
        assert r.status_code == 201, r.text
        yield Setup(gateway, events, replay)
    finally:
        if gateway is not None:
            gateway.stop()
        stop_process(worker)


async def _index_blocks(http: httpx.AsyncClient) -> int:
    workers = (await http.get("/v1/admin/workers")).json()["data"]
    return int(next(w for w in workers if w["name"] == WORKER)["index_blocks"])


async def _metric(http: httpx.AsyncClient, name: str, labels: dict[str, str]) -> float:
    return metric_value((await http.get("/metrics")).text, name, labels) or 0.0


async def _resets(http: httpx.AsyncClient, reason: str) -> float:
    return await _metric(http, "sluice_router_kv_index_resets_total", {"worker": WORKER, "reason": reason})


async def until(probe, expected, what: str) -> None:
    for _ in range(200):  # bounded: ~20 s
        if await probe() == expected:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never happened: {what} (last {await probe()!r})")


def _stored(seq: int, hashes: list[int], parent: int | None, tokens: list[int]) -> bytes:
    return g.batch([g.stored(hashes, parent, tokens, BS)], ts=float(seq))


async def _publisher(ctx: zmq.asyncio.Context, s: Setup) -> VllmPublisherStandIn:
    for _ in range(50):  # a just-closed publisher's port may take a moment to be free
        try:
            return VllmPublisherStandIn(ctx, s.events, bind=True, replay_endpoint=s.replay)
        except zmq.ZMQError:
            await asyncio.sleep(0.1)
    raise AssertionError("could not bind the publisher stand-in")


async def test_malformed_batches_gaps_and_restarts_reset_the_index_and_it_recovers(setup: Setup) -> None:
    ctx = zmq.asyncio.Context()
    pub = await _publisher(ctx, setup)
    try:
        async with httpx.AsyncClient(base_url=setup.gateway.url, timeout=30) as http:
            await pub.wait_subscribed()
            await pub.publish(0, _stored(0, [1, 2], None, TOKENS[:8]))
            await pub.publish(1, _stored(1, [3, 4], 2, TOKENS[8:]))
            await until(lambda: _index_blocks(http), 4, "warm index")

            # Malformed: bytes that are not msgpack, msgpack of the wrong shape, a message not in three
            # frames. Each loses whatever it said: cold; the next good batch is applied again.
            # (seq of the malformed batch, or None for a message without one; seq of the next good batch)
            malformed = [(2, b"\xc1\xc1 not msgpack", 3), (4, msgpack.packb({"unexpected": [1, 2]}), 5),
                         (None, b"", 6)]
            for n, (seq, payload, good) in enumerate(malformed, start=1):
                if seq is None:
                    await pub.send_raw([b"kv", b"not-a-seq"])
                else:
                    await pub.publish(seq, payload)
                await until(lambda: _resets(http, "malformed"), n, f"malformed message {n} counted")
                assert await _index_blocks(http) == 0
                await pub.publish(good, _stored(good, [10 * n, 10 * n + 1], None, TOKENS[:8]))
                await until(lambda: _index_blocks(http), 2, f"recovered after malformed message {n}")

            # A gap the replay cannot fill (the publisher's buffer no longer holds it).
            await pub.publish(7, _stored(7, [90], 31, TOKENS[8:12]), drop=True)
            pub.buffer.clear()
            await pub.publish(8, _stored(8, [91], None, TOKENS[:4]))
            await until(lambda: _resets(http, "gap"), 1, "unfillable gap counted")
            await until(lambda: _index_blocks(http), 1, "only what came after the gap")
            assert await _metric(http, "sluice_router_kv_event_gaps_total", {"worker": WORKER}) == 1

            # The engine restarts: a new publisher on the same endpoints whose count starts over. Its
            # first two batches go out before the subscriber has reconnected; replay brings them.
            await pub.close()
            pub = await _publisher(ctx, setup)
            await pub.publish(0, _stored(0, [101], None, TOKENS[:4]), drop=True)
            await pub.publish(1, _stored(1, [102], 101, TOKENS[4:8]), drop=True)
            await pub.wait_subscribed()
            await pub.publish(2, _stored(2, [103], 102, TOKENS[8:12]))
            await until(lambda: _resets(http, "restart"), 1, "restart counted")
            await until(lambda: _index_blocks(http), 3, "the restarted engine's blocks, replayed and chained")
            assert pub.replay_requests == [0]

            # Through all of it the subscriber task itself never died.
            assert await _metric(http, "sluice_background_task_restarts_total",
                                 {"task": "kv-events", "worker": WORKER}) == 0
            assert (await http.get("/health")).status_code == 200
    finally:
        await pub.close()
        ctx.term()
