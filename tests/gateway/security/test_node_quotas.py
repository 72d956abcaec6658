"""Quotas shared by the frontends of one node (gateway.security.node_quotas): two `QuotaService`s on
one table file, as two frontends run them. What one spends the other sees; a restarted frontend
frees what its dead requests held; a lock another process does not let go of sends each frontend
to its own count (with a log and a metric), and they share again once it is free."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from engines.errors import ErrorKind, SluiceError
from gateway.security.keys import Limits
from gateway.security.metrics import SecurityMetrics
from gateway.security.node_quotas import NodeQuotaStore
from gateway.security.quotas import QuotaService

LIMITS = {"k": Limits(rpm=3, tpm=60, concurrency=2)}


class Frontends:
    def __init__(self, table: Path) -> None:
        self.table = table
        self.started: list[QuotaService] = []
        self.registries: dict[int, CollectorRegistry] = {}

    async def new(self, index: int) -> QuotaService:
        registry = CollectorRegistry()
        q = QuotaService(LIMITS, SecurityMetrics(registry), NodeQuotaStore(self.table, index, 2), retry_s=0.05)
        self.registries[id(q)] = registry
        await q.start()
        self.started.append(q)
        return q

    def metric(self, q: QuotaService, name: str) -> float | None:
        return self.registries[id(q)].get_sample_value(name)


@pytest.fixture
async def frontends(tmp_path: Path) -> AsyncIterator[Frontends]:
    f = Frontends(tmp_path / "quotas")
    yield f
    for q in f.started:
        await q.stop()


@contextmanager
def held_lock(table: Path) -> Iterator[int]:
    """The table's lock, taken as a frontend stopped while it held it would hold it."""
    fd = os.open(table, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


async def refused(q: QuotaService, *, count: bool = True) -> str:
    with pytest.raises(SluiceError) as e:
        await q.admit("k", count=count)
    assert e.value.kind is ErrorKind.RATE_LIMITED
    return e.value.message


async def test_concurrency_held_in_one_frontend_counts_in_the_other(frontends: Frontends) -> None:
    a, b = await frontends.new(0), await frontends.new(1)
    first, second = await a.admit("k", count=False), await b.admit("k", count=False)
    assert "2 concurrent requests" in await refused(a, count=False)
    assert "2 concurrent requests" in await refused(b, count=False)
    a.finish(first)
    await a.flush()
    b.finish(await b.admit("k", count=False))  # the slot a freed
    b.finish(second)
    await b.flush()


async def test_requests_and_tokens_per_minute_are_one_budget(frontends: Frontends) -> None:
    a, b = await frontends.new(0), await frontends.new(1)
    for q in (a, b, a):
        q.finish(await q.admit("k", hold=False))
    assert "3 requests per minute" in await refused(b)
    await a.reserve_tokens("k", 50)
    with pytest.raises(SluiceError, match="60 tokens per minute"):
        await b.reserve_tokens("k", 20)
    assert frontends.metric(b, "sluice_quota_local") == 0.0 and b.health_detail() == \
        "shared through the frontends' quota table"


async def test_a_restarted_frontend_frees_what_its_dead_requests_held(frontends: Frontends) -> None:
    a, dead = await frontends.new(0), await frontends.new(1)
    await dead.admit("k", count=False)
    await dead.admit("k", count=False)  # never finished: the process died
    assert "concurrent" in await refused(a, count=False)
    await frontends.new(1)  # its restart clears its own slots
    a.finish(await a.admit("k", count=False))


async def test_a_lock_never_let_go_sends_each_frontend_to_its_own_count(
        frontends: Frontends, caplog: pytest.LogCaptureFixture) -> None:
    a = await frontends.new(0)
    with held_lock(frontends.table) as stuck, caplog.at_level(logging.WARNING, "sluice.quotas"):
        a.finish(await a.admit("k", count=False))  # admitted: open, never closed
        assert "the frontends' quota table unreachable" in caplog.text and "held the lock" in caplog.text
        assert frontends.metric(a, "sluice_quota_node_fallbacks_total") == 1.0
        assert frontends.metric(a, "sluice_quota_local") == 1.0
        assert "per-replica (the frontends' quota table is unreachable)" in (a.health_detail() or "")
        fcntl.flock(stuck, fcntl.LOCK_UN)
    for _ in range(200):  # the maintainer probes the table and shares again once it answers
        if a.shared:
            break
        await asyncio.sleep(0.01)
    assert a.shared and frontends.metric(a, "sluice_quota_local") == 0.0


async def _shared_again(q: QuotaService) -> None:
    for _ in range(500):  # the maintainer probes the table, tells it what is live, and shares again
        if q.shared:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the table never answered again")


async def test_a_slot_that_ended_while_the_table_was_away_is_freed_when_it_answers(frontends: Frontends) -> None:
    """A request that ends while its frontend counts alone sends no release; the table must not keep
    its slot for good (the key would be refused by every frontend until a restart)."""
    a, b = await frontends.new(0), await frontends.new(1)
    first = await a.admit("k", count=False)  # its slot is in the table
    with held_lock(frontends.table) as stuck:
        second = await a.admit("k", count=False)  # the table is away: counted here alone
        assert not a.shared
        a.finish(first)
        a.finish(second)
        fcntl.flock(stuck, fcntl.LOCK_UN)
    await _shared_again(a)
    leases = [await b.admit("k", count=False), await b.admit("k", count=False)]  # both slots are free
    assert "concurrent" in await refused(b, count=False)
    for lease in leases:
        b.finish(lease)
    await b.flush()


async def test_a_release_that_failed_is_corrected_and_a_late_one_is_not_counted_twice(
        frontends: Frontends, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = await frontends.new(0), await frontends.new(1)
    assert a.store is not None
    store = a.store
    first, kept = await a.admit("k", count=False), await a.admit("k", count=False)
    real_release = store.release

    async def failing(key_id: str, lease_id: str) -> None:
        raise TimeoutError("the lock was held too long")

    monkeypatch.setattr(store, "release", failing)
    a.finish(first)
    await a.flush()  # the release failed: the table still counts the slot, and the frontend went alone
    monkeypatch.setattr(store, "release", real_release)
    await _shared_again(a)
    b.finish(await b.admit("k", count=False))  # one slot free again (kept holds the other)
    await b.flush()
    await store.release("k", first.lease_id)  # a release arriving after the rewrite changes nothing
    held = await b.admit("k", count=False)  # with `kept`, the key's two
    assert "concurrent" in await refused(b, count=False)
    for lease in (held, kept):
        (b if lease is held else a).finish(lease)
    await a.flush()
    await b.flush()


async def test_a_key_the_full_table_cannot_hold_is_enforced_alone_and_only_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.security.node_quotas.ROWS", 2)
    registry = CollectorRegistry()
    limits = {name: Limits(concurrency=1) for name in ("k1", "k2", "k3")}
    q = QuotaService(limits, SecurityMetrics(registry), NodeQuotaStore(tmp_path / "quotas", 0, 2), retry_s=0.05)
    await q.start()
    try:
        held = [await q.admit(name, count=False) for name in ("k1", "k2", "k3")]
        assert [lease.slot for lease in held] == ["shared", "shared", "local"]
        with pytest.raises(SluiceError, match="1 concurrent requests"):
            await q.admit("k3", count=False)  # its limit holds, in this frontend
        assert q.shared and registry.get_sample_value("sluice_quota_node_fallbacks_total") == 0.0
        for lease in held:
            q.finish(lease)
        await q.flush()
    finally:
        await q.stop()


async def test_waiting_for_the_lock_leaves_the_event_loop_free(frontends: Frontends) -> None:
    """Every stream a frontend relays shares its loop: waiting for a sibling's lock must not stop it."""
    a = await frontends.new(0)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    with held_lock(frontends.table):
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        a.finish(await a.admit("k", count=False))  # waits out the lock, then goes alone
        during = ticks - before
        task.cancel()
    assert during > 0 and not a.shared
