"""K8sDiscovery.reconcile against a recording pool: what a pass adds, adopts, drains and removes.

The watcher threads are not started; each test sets what a spec's watcher listed, as the
watcher would, and runs passes by hand, so the order of events is exact.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

from engines.launchers.registration import WorkerRecord
from gateway.discovery.attest import Attestations
from gateway.discovery.k8s import K8sDiscovery
from gateway.discovery.spec import DiscoverySpec
from gateway.llm.workers.pool import WorkerPool

URL = "http://10.0.0.5:8100"


@dataclass
class _Router:
    drained: dict[str, bool] = field(default_factory=dict)

    def drain(self, name: str, on: bool) -> None:
        self.drained[name] = on

    def workers(self) -> list[Any]:
        return []  # nothing in flight: a drain ends at once


@dataclass
class _Pool:
    """Records what discovery does to the pool; `register` is a worker registering itself."""

    router: _Router = field(default_factory=_Router)
    records: dict[str, WorkerRecord] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def register(self, name: str, url: str) -> None:
        self.records[name] = WorkerRecord(name=name, url=url, engine="vllm")

    async def add(self, record: WorkerRecord) -> list[str]:
        self.added.append(record.name)
        self.records[record.name] = record
        return ["m"]

    async def remove(self, name: str) -> bool:
        self.removed.append(name)
        return self.records.pop(name, None) is not None


def _discovery(pool: _Pool, attestations: Attestations) -> K8sDiscovery:
    spec = DiscoverySpec(selector="app=w", drain_s=0.0)
    return K8sDiscovery([spec], cast(WorkerPool, pool), attestations)


async def _settle(d: K8sDiscovery) -> None:
    """Let the drain tasks a pass started run to their end."""
    await asyncio.gather(*list(d._leaving.values()))


async def test_an_attested_endpoint_is_added_and_drained_and_removed_when_it_leaves() -> None:
    pool, attestations = _Pool(), Attestations()
    d = _discovery(pool, attestations)
    await attestations.vouch("pod-a", URL)
    d._update(0, {"pod-a": URL})
    await d.reconcile()
    assert pool.added == ["pod-a"]
    d._update(0, {})
    await d.reconcile()
    await _settle(d)
    assert pool.router.drained == {"pod-a": True}
    assert pool.removed == ["pod-a"]


async def test_an_unattested_endpoint_is_never_added() -> None:
    pool = _Pool()
    d = _discovery(pool, Attestations())
    d._update(0, {"pod-a": URL})
    await d.reconcile()
    assert pool.added == [] and "pod-a" in d._pending


async def test_a_worker_registered_by_itself_is_left_alone_if_it_was_never_listed() -> None:
    pool = _Pool()
    pool.register("pod-b", URL)
    d = _discovery(pool, Attestations())
    d._update(0, {})
    await d.reconcile()
    d._update(0, {})
    await d.reconcile()
    await _settle(d)
    assert pool.removed == [] and pool.router.drained == {}


async def test_an_endpoint_that_registered_and_left_between_passes_is_drained() -> None:
    """Pass 1 lists the pod ready before it registers (it waits, unattested). It then registers
    itself and leaves the slices before any pass could adopt it. Pass 2 must still drain it:
    it was listed ready under that name and URL, so it is this discovery's worker."""
    pool = _Pool()
    d = _discovery(pool, Attestations())
    d._update(0, {"pod-a": URL})
    await d.reconcile()  # not registered yet: pending
    assert pool.added == []
    pool.register("pod-a", URL + "/")  # registered itself (the trailing slash does not matter)
    d._update(0, {})  # and left before the next pass
    await d.reconcile()
    await _settle(d)
    assert pool.router.drained == {"pod-a": True}
    assert pool.removed == ["pod-a"]


async def test_a_worker_registered_under_another_url_is_not_taken_for_the_listed_one() -> None:
    pool = _Pool()
    d = _discovery(pool, Attestations())
    d._update(0, {"pod-a": URL})
    await d.reconcile()
    pool.register("pod-a", "http://10.9.9.9:8100")  # same name, another address: not the listed endpoint
    d._update(0, {})
    await d.reconcile()
    await _settle(d)
    assert pool.removed == [] and pool.router.drained == {}
