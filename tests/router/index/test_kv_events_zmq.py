"""Real ZMQ sockets on loopback: a STAND-IN for vLLM's publisher feeding the subscriber.

The stand-in (tests/standins/vllm_kv_publisher.py) can lose chosen messages, empty its
replay buffer and restart the sequence on demand, which a real vLLM cannot be told to
do; tests/integration/vllm_pair/test_vllm_kv_replay.py checks replay against a real one.
"""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from router import Router, RouterConfig, WorkerInfo
from router.index.hashing import block_hashes, root_hash
from router.index.transports import ZmqEventSubscriber
from tests.router.index import eventgen as g
from tests.servers import free_port
from tests.standins.vllm_kv_publisher import VllmPublisherStandIn

BS = 4
TOKENS = list(range(1, 17))  # 4 blocks


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
                                 on_reset=lambda reason: r.feed.reset_kv_state("w", reason))
    else:  # vLLM with a concrete host connects, so the subscriber binds
        sub = ZmqEventSubscriber("w", "tcp://127.0.0.1:*", bind=True, topic="kv", ctx=ctx,
                                 on_batch=lambda b: r.feed.apply_kv_batch("w", b),
                                 on_reset=lambda reason: r.feed.reset_kv_state("w", reason))
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
                             on_reset=lambda reason: r.feed.reset_kv_state("w", reason))
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


async def test_malformed_messages_and_a_restart_seen_late_reset_the_index_then_it_recovers():
    ctx = zmq.asyncio.Context()
    reg = CollectorRegistry()
    r = Router(RouterConfig(speculative_ttl_s=1), registry=reg)
    r.add_worker(WorkerInfo("w", "http://127.0.0.1:1", ("m",), block_size=BS))
    pub = VllmPublisherStandIn(ctx, "tcp://127.0.0.1:*", bind=True)
    sub = ZmqEventSubscriber("w", pub.endpoint, bind=False, topic="kv", ctx=ctx, replay_endpoint=pub.replay_endpoint,
                             on_batch=lambda b: r.feed.apply_kv_batch("w", b),
                             on_reset=lambda reason: r.feed.reset_kv_state("w", reason))
    task = asyncio.create_task(sub.run())

    def resets(reason: str) -> float:
        return reg.get_sample_value("sluice_router_kv_index_resets_total", {"worker": "w", "reason": reason}) or 0

    try:
        await pub.wait_subscribed()
        for seq in range(4):
            await pub.publish(seq, g.batch([g.stored([seq + 1], seq or None, TOKENS[seq * 4:seq * 4 + 4], BS)]))
        await until(lambda: cached(r) == 16, "warm")
        await pub.publish(4, b"\xc1 not msgpack")  # undecodable payload
        await until(lambda: resets("malformed") == 1, "malformed payload")
        assert cached(r) == 0
        await pub.publish(5, g.batch([g.stored([11], None, TOKENS[:4], BS)]))
        await until(lambda: cached(r) == 4, "recovered")
        await pub.send_raw([b"kv", b"short"])  # not [topic, 8-byte seq, payload]
        await until(lambda: resets("malformed") == 2, "malformed framing")
        assert cached(r) == 0 and not task.done()

        # The engine restarts; its batches 0 and 1 are missed, 2 arrives first (seq went back).
        pub.buffer.clear()
        await pub.publish(0, g.batch([g.stored([21], None, TOKENS[:4], BS)]), drop=True)
        await pub.publish(1, g.batch([g.stored([22], 21, TOKENS[4:8], BS)]), drop=True)
        await pub.publish(2, g.batch([g.stored([23], 22, TOKENS[8:12], BS)]))
        await until(lambda: sub.stats.last_seq == 2, "restart seen")
        assert resets("restart") == 1 and sub.stats.restarts == 1
        assert pub.replay_requests[-1] == 0  # the new life's first batches were asked for again
        assert cached(r) == 12  # and chained: the index knows the restarted engine's blocks
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pub.close()
        ctx.term()
