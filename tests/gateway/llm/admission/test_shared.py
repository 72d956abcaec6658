"""Fair-queuing counters shared by replicas through a real redis-server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from gateway.llm.admission import AdmissionConfig
from gateway.llm.admission.shared import SharedCounters
from gateway.llm.registry import ModelRegistry
from tests.gateway.llm.fakes import FakeTokenizer
from tests.redis_server import HAVE_REDIS, RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not HAVE_REDIS, reason="redis-server not installed")]


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    yield srv
    srv.kill()


def replica(url: str) -> tuple[ModelRegistry, SharedCounters]:
    registry = ModelRegistry(AdmissionConfig(max_running=4, max_queued=4))
    registry.add("m", FakeTokenizer(), 4096, None)  # type: ignore[arg-type]
    queues = {name: m.admission.queue for name, m in registry.models.items()}
    return registry, SharedCounters(aioredis.Redis.from_url(url), lambda: queues)


async def test_a_tenant_served_on_one_replica_is_charged_on_the_others(redis_server: RedisServer) -> None:
    (reg1, sync1), (reg2, sync2) = replica(redis_server.url), replica(redis_server.url)
    q1, q2 = reg1.models["m"].admission.queue, reg2.models["m"].admission.queue
    q1.charge("flood", 10, 2.0)  # each replica saw the tenant once before: now both read the totals
    q2.charge("flood", 10, 2.0)
    for s in (sync1, sync2):
        await s.sync("m")
    before = q2.counters["flood"]
    q1.charge("flood", 3000, 2.0)  # replica 1 serves the flood 3000 tokens
    await sync1.sync("m")
    await sync2.sync("m")
    assert q2.counters["flood"] - before == pytest.approx(1500.0)  # charged on replica 2, per its weight
    await sync1.sync("m")
    # Its own 10 and 3000, and replica 2's 10, once each: its own tokens are not charged twice.
    assert q1.counters["flood"] == pytest.approx((10 + 3000 + 10) / 2)


async def test_redis_going_away_keeps_the_tokens_for_the_next_round(redis_server: RedisServer) -> None:
    reg, sync = replica(redis_server.url)
    q = reg.models["m"].admission.queue
    q.charge("a", 100)
    redis_server.kill()
    await sync.sync("m")  # logged, not raised
    assert q.take_unsynced() == {"a": 100.0}
