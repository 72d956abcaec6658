"""Quotas shared by replicas through a real redis-server: two `QuotaService`s in one process.

Each service is what one gateway replica runs. What one spends, the other sees;
a lease whose replica stopped renewing expires; with Redis gone each replica
enforces the limits alone, and shares them again once Redis is back.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from prometheus_client import CollectorRegistry

from engines.errors import ErrorKind, SluiceError
from gateway.security.keys import Limits
from gateway.security.metrics import SecurityMetrics
from gateway.security.quotas import QuotaService
from gateway.security.redis_store import RedisQuotaStore
from tests.redis_server import HAVE_REDIS, RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not HAVE_REDIS, reason="redis-server not installed")]

LIMITS = {"k": Limits(rpm=2, tpm=60, concurrency=1), "k2": Limits(concurrency=2)}
REGISTRIES: dict[int, CollectorRegistry] = {}


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    yield srv
    srv.kill()


class Replicas:
    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = f"test-{uuid.uuid4().hex[:8]}"
        self.started: list[QuotaService] = []

    async def new(self, *, lease_ttl_s: float = 30.0, start: bool = True) -> QuotaService:
        store = RedisQuotaStore(self.url, prefix=self.prefix, lease_ttl_s=lease_ttl_s)
        registry = CollectorRegistry()
        q = QuotaService(LIMITS, SecurityMetrics(registry), store, retry_s=0.05)
        REGISTRIES[id(q)] = registry
        if start:
            await q.start()
        self.started.append(q)
        return q


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[Replicas]:
    r = Replicas(redis_server.url)
    yield r
    for q in r.started:
        await q.stop()


def refused(e: pytest.ExceptionInfo[SluiceError], reason: str) -> bool:
    return e.value.kind is ErrorKind.RATE_LIMITED and (e.value.retry_after_s or 0) >= 1 and reason in e.value.message


def metric(q: QuotaService, name: str, **labels: str) -> float | None:
    return REGISTRIES[id(q)].get_sample_value(name, labels)


async def until(cond, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(500):  # bounded: ~10 s
        if await cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def test_requests_per_minute_are_shared(replicas: Replicas) -> None:
    a, b = await replicas.new(), await replicas.new()
    for _ in range(2):
        a.finish(await a.admit("k", hold=False))
    with pytest.raises(SluiceError) as e:
        await b.admit("k", hold=False)
    assert refused(e, "requests per minute")
    assert metric(b, "sluice_key_rejections_total", key_id="k", reason="rpm") == 1


async def test_concurrency_is_shared_and_freed(replicas: Replicas) -> None:
    a, b = await replicas.new(), await replicas.new()
    lease = await a.admit("k", count=False)
    with pytest.raises(SluiceError) as e:
        await b.admit("k", count=False)
    assert refused(e, "concurrent requests")
    a.finish(lease)
    await a.flush()
    b.finish(await b.admit("k", count=False))


async def test_tokens_are_shared(replicas: Replicas) -> None:
    a, b = await replicas.new(), await replicas.new()
    await a.reserve_tokens("k", 40)
    with pytest.raises(SluiceError) as e:
        await b.reserve_tokens("k", 30)
    assert refused(e, "tokens per minute")
    a.refund_tokens("k", 40)
    await a.flush()
    await b.reserve_tokens("k", 30)
    b.commit_tokens("k", 30, 25)  # the completion overdraws what is left
    await b.flush()
    with pytest.raises(SluiceError):
        await a.reserve_tokens("k", 10)


async def test_a_dead_replicas_slot_expires_and_a_live_one_renews(replicas: Replicas,
                                                                   redis_server: RedisServer) -> None:
    dead = await replicas.new(lease_ttl_s=0.6, start=False)  # never renews, as if its process had died
    live = await replicas.new(lease_ttl_s=0.6)
    other = await replicas.new()
    await dead.admit("k2", count=False)
    await live.admit("k2", count=False)  # its renewals keep the slots key itself alive
    client, slots = redis_server.client(), f"{replicas.prefix}:{{k2}}:slots"
    (live_lease, first_expiry), = [(m, score) for m, score in client.zrange(slots, 0, -1, withscores=True)
                                   if m.decode().startswith(live._replica)]

    async def admitted() -> bool:
        try:
            other.finish(await other.admit("k2", count=False))
        except SluiceError:
            return False
        await other.flush()
        return True

    assert not await admitted()  # both slots held
    await until(admitted, "the dead replica's lease to expire")

    async def renewed_twice() -> bool:
        return (client.zscore(slots, live_lease) or 0) > first_expiry + 0.5 * 0.6 * 1e6

    await until(renewed_twice, "the live replica to renew its lease")
    held = await other.admit("k2", count=False)  # the dead replica's slot
    with pytest.raises(SluiceError):  # the live one's, older than its first TTL, is still held
        await other.admit("k2", count=False)
    other.finish(held)


async def test_outage_falls_back_to_local_quotas_and_recovers(replicas: Replicas, redis_server: RedisServer) -> None:
    a, b = await replicas.new(), await replicas.new()
    assert metric(a, "sluice_quota_redis_up") == 1
    redis_server.kill()
    for _ in range(2):  # served locally: the outage is not the client's problem
        a.finish(await a.admit("k", hold=False))
    with pytest.raises(SluiceError) as e:  # and the limit still holds, on this replica alone
        await a.admit("k", hold=False)
    assert refused(e, "requests per minute")
    assert metric(a, "sluice_quota_redis_up") == 0 and metric(a, "sluice_quota_redis_fallbacks_total") == 1
    b.finish(await b.admit("k", hold=False))  # b does not see a's local usage

    redis_server.start()  # same port, empty

    async def shared_again() -> bool:
        return a.shared and b.shared

    await until(shared_again, "both replicas to reconnect")
    assert metric(a, "sluice_quota_redis_up") == 1
    c = await replicas.new()  # a fresh key budget in the restarted Redis, seen by every replica
    for _ in range(2):
        c.finish(await c.admit("k", hold=False))
    with pytest.raises(SluiceError):
        await a.admit("k", hold=False)
