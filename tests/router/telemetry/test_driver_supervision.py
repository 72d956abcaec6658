"""A router driver that raises is logged, counted and restarted; it does not die silently.

The failures are injected into a running router: the feed the drivers report into is
made to raise once (a bug in the state it updates), or a subscriber's socket is closed
under it. Health checks go to a closed loopback port (connection refused, the normal
"worker down" answer); KV events come from the vLLM publisher STAND-IN on real ZMQ
sockets (tests/standins/vllm_kv_publisher.py).
"""

from __future__ import annotations

import asyncio

import zmq.asyncio
from prometheus_client import CollectorRegistry

from router import Router, RouterConfig, WorkerInfo
from tests.router.index import eventgen as g
from tests.servers import free_port
from tests.standins.vllm_kv_publisher import VllmPublisherStandIn

BS = 4
TOKENS = list(range(1, 17))


async def until(cond, what: str) -> None:
    for _ in range(1000):  # bounded: ~10 s at most
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def restarts(reg: CollectorRegistry, task: str, worker: str) -> float:
    return reg.get_sample_value("sluice_background_task_restarts_total", {"task": task, "worker": worker}) or 0.0


async def test_a_health_loop_that_raises_is_restarted_and_counted(monkeypatch, caplog) -> None:
    reg = CollectorRegistry()
    r = Router(RouterConfig(health_interval_s=0.02, scrape_interval_s=0), registry=reg)
    r.add_worker(WorkerInfo("w", f"http://127.0.0.1:{free_port()}", ("m",), block_size=BS))
    feed = r.feed
    checks: list[bool] = []
    original = feed.record_health_check

    def record(worker: str, ok: bool) -> None:
        checks.append(ok)
        if len(checks) == 2:
            raise RuntimeError("injected bug in the health bookkeeping")
        original(worker, ok)

    monkeypatch.setattr(feed, "record_health_check", record)
    await r.start()
    try:
        await until(lambda: len(checks) >= 6, "health checks go on after the failure")
        assert restarts(reg, "health", "w") == 1
        assert "background task health-w failed" in caplog.text and "injected bug" in caplog.text
        assert not r.workers()[0].healthy  # the checks after the restart still count
    finally:
        await r.stop()


async def test_kv_events_survive_a_failing_batch_and_a_dead_socket(monkeypatch) -> None:
    ctx = zmq.asyncio.Context.instance()
    reg = CollectorRegistry()
    r = Router(RouterConfig(health_interval_s=60, scrape_interval_s=0), registry=reg)
    pub = VllmPublisherStandIn(ctx, "tcp://127.0.0.1:*", bind=True)
    r.add_worker(WorkerInfo("w", "http://127.0.0.1:1", ("m",), block_size=BS, kv_events_endpoint=pub.endpoint,
                            kv_events_topic="kv"))
    feed = r.feed
    original = feed.apply_kv_batch
    calls: list[int] = []

    def apply(worker, batch) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected bug while applying a batch")
        original(worker, batch)

    monkeypatch.setattr(feed, "apply_kv_batch", apply)

    def cached() -> int:
        return r.rank("m", [*TOKENS, 0]).best.predicted_cached_tokens

    await r.start()
    try:
        await pub.wait_subscribed()
        await pub.publish(0, g.batch([g.stored([1, 2], None, TOKENS[:8], BS)]))
        await until(lambda: cached() == 8, "first batch")
        await pub.publish(1, g.batch([g.stored([3], 2, TOKENS[8:12], BS)]))  # its handling raises
        await until(lambda: len(calls) == 2, "second batch")
        await pub.publish(2, g.batch([g.stored([5, 6, 7, 8], None, TOKENS, BS)]))
        await until(lambda: cached() == 16, "the subscriber went on")
        resets = reg.get_sample_value("sluice_router_kv_index_resets_total", {"worker": "w", "reason": "error"})
        assert resets == 1  # what the failed batch said is lost: the index was reset, not trusted
        assert restarts(reg, "kv-events", "w") == 0  # survived in place

        # Now the socket dies under the running subscriber: the task restarts with a fresh one.
        r._drivers._subscribers["w"]._sub.close(linger=0)  # type: ignore[union-attr]
        await until(lambda: restarts(reg, "kv-events", "w") == 1, "subscriber task restarted")
        await pub.wait_subscribed()
        await pub.publish(3, g.batch([g.removed([8])]))
        await until(lambda: cached() == 12, "events flow through the new socket")
    finally:
        await r.stop()
        await pub.close()
