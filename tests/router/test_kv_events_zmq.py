"""Real ZMQ sockets on loopback: a STAND-IN for vLLM's publisher feeding the subscriber.

A stand-in because these tests must lose chosen messages, empty the replay
buffer and restart the sequence on demand, which a real vLLM cannot be told to
do; tests/integration/test_vllm_kv_replay.py checks replay against a real one.
The stand-in speaks vLLM's ZmqEventPublisher wire protocol: multipart
[topic, seq (8 bytes big-endian), msgpack EventBatch] on PUB, and a ROUTER
replay socket answering [b"", start_seq] with one reply per batch and then an
end marker with seq -1: [b"", topic, seq, payload] as vLLM 0.32 sends them, or
[b"", seq, payload] as older releases did. It is an XPUB so the test can wait
for the subscription instead of sleeping (PUB drops messages sent before a
subscriber joined).
"""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from router import Router, RouterConfig, WorkerInfo
from router.hashing import block_hashes, root_hash
from router.kv_events import ZmqEventSubscriber
from tests.router import eventgen as g
from tests.servers import free_port

BS = 4
TOKENS = list(range(1, 17))  # 4 blocks


class VllmPublisherStandIn:
    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, *, bind: bool, topic: bytes = b"kv",
                 replay_with_topic: bool = True) -> None:
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        if bind:
            self.pub.bind(endpoint)
            self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self.pub.connect(endpoint)
            self.endpoint = endpoint
        self.replay = ctx.socket(zmq.ROUTER)
        self.replay.setsockopt(zmq.LINGER, 0)
        self.replay.bind("tcp://127.0.0.1:*")
        self.replay_endpoint = self.replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self.topic = topic
        self._reply_head = [b"", topic] if replay_with_topic else [b""]
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self._task = asyncio.create_task(self._serve_replay())

    async def wait_subscribed(self) -> None:
        msg = await asyncio.wait_for(self.pub.recv(), 10)
        assert msg[0] == 1  # XPUB subscription message

    async def publish(self, seq: int, payload: bytes, *, drop: bool = False) -> None:
        """Record `seq` for replay; `drop` simulates a message lost on the wire."""
        self.buffer.append((seq, payload))
        if not drop:
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    async def _serve_replay(self) -> None:
        while True:
            client, _, start = await self.replay.recv_multipart()
            start_seq = int.from_bytes(start, "big")
            self.replay_requests.append(start_seq)
            for seq, payload in self.buffer:
                if seq >= start_seq:
                    await self.replay.send_multipart([client, *self._reply_head, seq.to_bytes(8, "big"), payload])
            end = (-1).to_bytes(8, "big", signed=True)
            await self.replay.send_multipart([client, *[b""] * len(self._reply_head), end, b""])

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.pub.close(0)
        self.replay.close(0)


async def until(cond, what: str) -> None:
    for _ in range(1000):  # bounded: ~10 s at most
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def make_router() -> Router:
    r = Router(RouterConfig(speculative_ttl_s=1))
    r.add_worker(WorkerInfo("w", "http://127.0.0.1:1", ("m",), block_size=BS))
    return r


def cached(r: Router) -> int:
    return r.rank("m", [*TOKENS, 0]).best.predicted_cached_tokens


def chain() -> list[int]:
    return block_hashes(TOKENS, BS, root_hash("m"))


@pytest.mark.parametrize("publisher_binds", [True, False])
async def test_batches_in_both_encodings_reach_the_index(publisher_binds):
    ctx = zmq.asyncio.Context()
    r = make_router()
    if publisher_binds:
        pub = VllmPublisherStandIn(ctx, "tcp://127.0.0.1:*", bind=True)
        sub = ZmqEventSubscriber("w", pub.endpoint, bind=False, topic="kv", ctx=ctx,
                                 on_batch=lambda b: r.feed.apply_kv_batch("w", b),
                                 on_reset=lambda: r.feed.reset_kv_state("w"))
    else:  # vLLM with a concrete host connects, so the subscriber binds
        sub = ZmqEventSubscriber("w", "tcp://127.0.0.1:*", bind=True, topic="kv", ctx=ctx,
                                 on_batch=lambda b: r.feed.apply_kv_batch("w", b),
                                 on_reset=lambda: r.feed.reset_kv_state("w"))
        pub = VllmPublisherStandIn(ctx, sub.endpoint, bind=False)
    task = asyncio.create_task(sub.run())
    try:
        await pub.wait_subscribed()
        await pub.publish(0, g.batch([g.stored([1, 2], None, TOKENS[:8], BS)], array=False))  # map form
        await pub.publish(1, g.batch([g.stored([b"\x03", b"\x04"], 2, TOKENS[8:], BS, array=True)],
                                     array=True))  # array form, bytes hashes
        await until(lambda: sub.stats.batches == 2, "two batches")
        assert cached(r) == 16
        await pub.publish(2, g.batch([g.removed([b"\x03"], array=True)]))
        await until(lambda: sub.stats.batches == 3, "removal")
        assert cached(r) == 8
        assert sub.stats.gaps == 0 and sub.stats.decode_errors == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pub.close()
        ctx.term()


@pytest.mark.parametrize("replay_with_topic", [True, False])
async def test_gap_is_filled_by_replay_and_unfillable_gap_resets(replay_with_topic):
    ctx = zmq.asyncio.Context()
    r = make_router()
    gaps: list[bool] = []
    pub = VllmPublisherStandIn(ctx, "tcp://127.0.0.1:*", bind=True, replay_with_topic=replay_with_topic)
    sub = ZmqEventSubscriber("w", pub.endpoint, bind=False, topic="kv", ctx=ctx,
                             replay_endpoint=pub.replay_endpoint, on_gap=gaps.append,
                             on_batch=lambda b: r.feed.apply_kv_batch("w", b),
                             on_reset=lambda: r.feed.reset_kv_state("w"))
    task = asyncio.create_task(sub.run())
    try:
        await pub.wait_subscribed()
        await pub.publish(0, g.batch([g.stored([1], None, TOKENS[:4], BS)]))
        await pub.publish(1, g.batch([g.stored([2], 1, TOKENS[4:8], BS)]), drop=True)
        await pub.publish(2, g.batch([g.stored([3], 2, TOKENS[8:12], BS)]), drop=True)
        await pub.publish(3, g.batch([g.stored([4], 3, TOKENS[12:], BS)]))
        await until(lambda: sub.stats.last_seq == 3, "seq 3")
        assert pub.replay_requests == [1]
        assert gaps == [True] and sub.stats.replays == 1
        assert cached(r) == 16  # the chain is whole: replayed parents made seq 3 resolvable

        # Now lose seq 4 for good (the engine's replay buffer no longer has it).
        await pub.publish(4, g.batch([g.removed([4])]), drop=True)
        pub.buffer.pop()
        await pub.publish(5, g.batch([g.stored([9], None, [7] * 4, BS)]))
        await until(lambda: sub.stats.last_seq == 5, "seq 5")
        assert gaps == [True, False] and sub.stats.replay_failures == 1
        assert cached(r) == 0  # exact entries were dropped: they may be stale

        await pub.publish(5, g.batch([]))  # a duplicate is ignored
        await pub.publish(0, g.batch([g.stored([1], None, TOKENS[:4], BS)]))  # engine restarted
        await until(lambda: sub.stats.restarts == 1, "restart")
        await until(lambda: cached(r) == 4, "restart batch applied")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pub.close()
        ctx.term()


async def test_router_start_subscribes_from_worker_info():
    ctx = zmq.asyncio.Context.instance()
    port = free_port()
    reg = CollectorRegistry()
    r = Router(RouterConfig(health_interval_s=60, scrape_interval_s=0), registry=reg)
    r.add_worker(WorkerInfo("w", "http://127.0.0.1:1", ("m",), block_size=BS,
                            kv_events_endpoint=f"tcp://127.0.0.1:{port}", kv_events_bind=True,
                            kv_events_topic="kv"))
    await r.start()
    pub = VllmPublisherStandIn(ctx, f"tcp://127.0.0.1:{port}", bind=False)
    try:
        await pub.wait_subscribed()
        await pub.publish(0, g.batch([g.stored([1, 2, 3, 4], None, TOKENS, BS)], ts=0.0))
        await until(lambda: cached(r) == 16, "event applied through Router.start()")
        assert reg.get_sample_value("sluice_router_kv_event_lag_seconds", {"worker": "w"}) > 0  # ts=0 is long ago
    finally:
        await r.stop()
        await pub.close()
