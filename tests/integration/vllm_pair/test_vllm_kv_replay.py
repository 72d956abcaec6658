"""A KV-event gap filled from a real vLLM worker's replay socket.

The gap is made by :class:`LossyLink`, a STAND-IN for a network that loses
messages: vLLM cannot be told to lose a batch on demand (its PUB socket drops
only past a 100 000-message high-water mark), so the link relays the worker's
event stream to the router and drops the batches it is told to. Everything
else is real: vLLM publishes and answers replay requests, and the router's own
subscriber (started by ``Router.start``) notices the gap and replays it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from router import Router, RouterConfig, WorkerInfo
from router.index.events import BlockStored, EventBatch, decode_vllm_batch
from tests.integration.conftest import BLOCK, MODEL, Worker

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

NAME = "replayed"
TOPIC = "kv"  # the launcher's kv-events topic


class LossyLink:
    """Relays one worker's KV-event stream; while `dropping`, batches are kept here instead of sent on."""

    def __init__(self, ctx: zmq.asyncio.Context, upstream: str) -> None:
        self._sub = ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(upstream)
        # XPUB, so the test can wait for the router's subscription instead of sleeping.
        self._pub = ctx.socket(zmq.XPUB)
        self._pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.dropping = False
        self.dropped: list[EventBatch] = []

    async def wait_subscribed(self) -> None:
        assert (await asyncio.wait_for(self._pub.recv(), 10))[0] == 1  # a subscribe message

    async def run(self) -> None:
        while True:
            frames = await self._sub.recv_multipart()
            if self.dropping:
                self.dropped.append(decode_vllm_batch(frames[2]))
            else:
                await self._pub.send_multipart(frames)

    def close(self) -> None:
        self._sub.close(linger=0)
        self._pub.close(linger=0)


def _prompt(k: int) -> list[int]:
    """Two full blocks and a tail, distinct from every other test's prompts."""
    return [20011 + 7 * k + (j * 29) % 20000 for j in range(2 * BLOCK + 10)]


async def _complete(client: httpx.AsyncClient, worker: Worker, ids: list[int]) -> None:
    # Straight to the worker: the router adds no speculative entry, so what it
    # knows about this prompt it can only have learned from KV events.
    response = await client.post(worker.url + "/v1/completions", headers=worker.headers,
                                 json={"model": MODEL, "prompt": ids, "max_tokens": 1})
    response.raise_for_status()


async def _until(cond: Callable[[], bool], what: str, attempts: int = 200) -> None:
    for _ in range(attempts):  # bounded: ~10 s
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def _stored_tokens(batches: list[EventBatch]) -> list[int]:
    return [t for b in batches for e in b.events if isinstance(e, BlockStored) for t in e.token_ids]


def _holds(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


async def test_a_lost_batch_is_replayed_from_the_real_worker(workers: list[Worker]) -> None:
    worker = workers[0]
    reg = CollectorRegistry()

    def counter(name: str) -> float:
        return reg.get_sample_value(f"sluice_router_kv_event_{name}_total", {"worker": NAME}) or 0.0

    def cached(ids: list[int]) -> int:
        return router.rank(MODEL, ids).best.predicted_cached_tokens

    link = LossyLink(zmq.asyncio.Context.instance(), f"tcp://127.0.0.1:{worker.kv_port}")
    relay = asyncio.create_task(link.run())
    router = Router(RouterConfig(health_interval_s=60, scrape_interval_s=0), registry=reg)
    router.add_worker(WorkerInfo(NAME, worker.url, (MODEL,), block_size=BLOCK, kv_events_endpoint=link.endpoint,
                                 kv_events_replay_endpoint=f"tcp://127.0.0.1:{worker.kv_port + 1}",
                                 kv_events_topic=TOPIC))
    await router.start()
    try:
        await link.wait_subscribed()
        async with httpx.AsyncClient(timeout=120) as client:
            # The link's own subscription to vLLM may still be joining: warm up until a
            # batch has gone all the way through, so the router knows the current seq.
            # A busy machine can deliver a batch later than the next warm-up request, so any
            # warm-up prompt seen counts (bounded: 20 prompts, then 5 s more).
            warm = None
            for k in range(20):
                await _complete(client, worker, _prompt(k))
                await asyncio.sleep(0.2)
                if (warm := next((j for j in range(k + 1) if cached(_prompt(j)) == 2 * BLOCK), None)) is not None:
                    break
            for _ in range(50):
                if warm is not None:
                    break
                await asyncio.sleep(0.1)
                warm = next((j for j in range(20) if cached(_prompt(j)) == 2 * BLOCK), None)
            assert warm is not None, "no event arrived"
            gaps, replays = counter("gaps"), counter("replays")

            lost, later = _prompt(100), _prompt(101)
            link.dropping = True
            await _complete(client, worker, lost)
            await _until(lambda: _holds(_stored_tokens(link.dropped), lost[: 2 * BLOCK]), "batch dropped")
            link.dropping = False
            assert cached(lost) == 0  # the router has not heard of it

            await _complete(client, worker, later)  # the next batch reveals the gap
            await _until(lambda: cached(later) == 2 * BLOCK, "later batch applied")
    finally:
        await router.stop()
        relay.cancel()
        await asyncio.gather(relay, return_exceptions=True)
        link.close()
    assert (counter("gaps") - gaps, counter("replays") - replays) == (1, 1)
    assert cached(lost) == 2 * BLOCK  # replay delivered the lost batch's blocks
    assert cached(_prompt(warm)) == 2 * BLOCK  # and the blocks from before the gap were kept
