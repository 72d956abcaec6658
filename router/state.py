"""The router's mutable state, and the feed the background drivers report into.

One :class:`RouterState` per router holds the worker table, the prefix index,
the load bookkeeping and the metrics. `router.router.Router` reads and writes
it for requests, `router.telemetry.drivers.Drivers` report into it through its
:class:`~router.telemetry.drivers.WorkerFeed` methods, and `router.replicas.sync.ReplicaSync`
applies other replicas' changes to it. Changes the index learns from this
replica's own workers are published to the shared state, if any.

Not thread-safe: everything runs on one event loop, and nothing here blocks.
Feed methods ignore workers they do not know (a report racing a removal).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.config import RouterConfig, WorkerInfo
from router.cost import KvPressure
from router.index.applier import EventApplier
from router.index.events import BlockRemoved, BlockStored, EventBatch, KVEvent
from router.index.prefix_index import PrefixIndex
from router.learning import CostLearner
from router.shared import SharedState
from router.telemetry.health import CircuitBreaker, WorkerHealth
from router.telemetry.load import LoadTracker, ScrapedMetrics
from router.telemetry.metrics import RouterMetrics


@dataclass(slots=True)
class WorkerEntry:
    info: WorkerInfo
    health: WorkerHealth
    applier: EventApplier
    # Tokens per KV block: WorkerInfo.block_size, else learned from /metrics or
    # events, else RouterConfig.default_block_size until one of those arrives.
    block_size: int
    # KV capacity in blocks: WorkerInfo.capacity_blocks, else num_gpu_blocks from /metrics.
    capacity_blocks: int | None = None


class RouterState:
    """Workers, index, load and metrics of one router."""

    def __init__(self, config: RouterConfig, metrics: RouterMetrics, shared: SharedState | None,
                 clock: Callable[[], float]) -> None:
        self.config = config
        self.metrics = metrics
        self.shared = shared
        self.clock = clock
        self.index = PrefixIndex(config.max_blocks_per_worker)
        self.load = LoadTracker(config.scrape_stale_s)
        self.learn = CostLearner(config.learning)
        self.workers: dict[str, WorkerEntry] = {}
        self.event_fed: set[str] = set()  # workers whose events this replica applied itself

    # -- the worker table ------------------------------------------------------
    def add(self, info: WorkerInfo) -> WorkerEntry:
        """Register (or replace the description of) a worker, keeping what was learned about it."""
        old = self.workers.get(info.name)
        c = self.config
        health = old.health if old else WorkerHealth(
            c.unhealthy_after_failures,
            CircuitBreaker(c.breaker_failures, c.breaker_cooldown_s, c.breaker_max_cooldown_s),
            # Alive since about the previous check: its interval and its own timeout.
            c.health_interval_s + c.health_timeout_s)
        # Keep the engine->router hash map across a re-registration, or removals of
        # blocks stored before it could no longer be applied.
        applier = (old.applier if old and old.info.models == info.models
                   else EventApplier(info.name, info.models, self.index, c.max_blocks_per_worker))
        block_size = info.block_size or (old.block_size if old else c.default_block_size)
        capacity = info.capacity_blocks or (old.capacity_blocks if old else None)
        entry = WorkerEntry(info, health, applier, block_size, capacity)
        self.workers[info.name] = entry
        self.metrics.init_worker(info.name, info.has_events)
        self.index.add_worker(info.name, None if info.has_events else (capacity or c.approx_capacity_blocks))
        return entry

    def remove(self, name: str) -> bool:
        """Forget a worker, its index entries and its series; False if it was unknown."""
        if self.workers.pop(name, None) is None:
            return False
        self.index.remove_worker(name)
        self.event_fed.discard(name)
        self.load.forget(name)
        self.learn.forget(name)
        self.metrics.forget_worker(name)
        return True

    def kv_pressure(self, w: WorkerEntry) -> KvPressure | None:
        """What the eviction term needs; None without a known capacity or events to measure refills."""
        if w.capacity_blocks is None or not w.info.has_events:
            return None
        name = w.info.name
        return KvPressure(w.capacity_blocks - self.index.size(name), self.learn.refill_ratio(name), w.block_size)

    # -- WorkerFeed --------------------------------------------------------------
    def apply_kv_batch(self, worker: str, batch: EventBatch) -> None:
        if worker not in self.workers:
            return
        self.apply_kv_events(worker, batch.events)
        # The engine stamps batches with its wall clock, so lag is measured on ours.
        self.metrics.kv_lag.labels(worker).set(max(0.0, time.time() - batch.ts))

    def apply_kv_events(self, worker: str, events: Sequence[KVEvent]) -> None:
        w = self.workers.get(worker)
        if w is None:
            return
        self.event_fed.add(worker)
        for ev in events:
            self._apply_event(w, ev)
        if w.info.block_size is None and w.applier.observed_block_size:
            w.block_size = w.applier.observed_block_size
        self.metrics.kv_events.labels(worker).inc(len(events))

    def _apply_event(self, w: WorkerEntry, ev: KVEvent) -> None:
        name, shared = w.info.name, self.shared
        if isinstance(ev, BlockRemoved):
            gone = w.applier.removed_router_hashes(ev)
            w.applier.apply(ev)
            self.learn.evicted(name, gone)
            if shared is not None and gone:
                shared.publish_remove(name, gone)
        elif isinstance(ev, BlockStored):
            stored = w.applier.apply(ev)
            self.learn.stored(name, stored)
            self.load.stored(name, stored)
            if shared is not None and stored:
                shared.publish_store(name, stored, None)
        else:
            w.applier.apply(ev)
            if shared is not None:
                shared.publish_clear(name, False)

    def reset_kv_state(self, worker: str, reason: str) -> None:
        w = self.workers.get(worker)
        if w is None:
            return
        w.applier.reset()  # speculative entries stay: after a gap they are still the best guess
        self.metrics.kv_resets.labels(worker, reason).inc()
        if self.shared is not None:
            self.shared.publish_clear(worker, True)

    def record_kv_gap(self, worker: str, filled: bool) -> None:
        if worker not in self.workers:
            return
        self.metrics.kv_gaps.labels(worker).inc()
        if filled:
            self.metrics.kv_replays.labels(worker).inc()

    def record_health_check(self, worker: str, ok: bool) -> None:
        w = self.workers.get(worker)
        if w is not None and w.health.record_check(ok, self.clock()):
            self.metrics.checks_excused.labels(worker).inc()

    def apply_scrape(self, worker: str, metrics: ScrapedMetrics) -> None:
        """Record a /metrics scrape; learns block size and capacity unless configured."""
        w = self.workers.get(worker)
        if w is None:
            return
        now = self.clock()
        self.load.set_scraped(worker, metrics, now)
        if w.info.block_size is None and metrics.block_size:
            w.block_size = metrics.block_size
        if w.info.capacity_blocks is None and metrics.num_gpu_blocks:
            w.capacity_blocks = metrics.num_gpu_blocks
            if not w.info.has_events:
                self.index.set_capacity(worker, metrics.num_gpu_blocks)

    def record_task_restart(self, task: str, worker: str) -> None:
        self.metrics.task_restarts.labels(task, worker).inc()

    def maintain(self) -> None:
        now = self.clock()
        self.index.prune(now)
        m = self.metrics
        for name, w in self.workers.items():
            m.healthy.labels(name).set(1 if w.health.available(now) else 0)
            m.breaker.labels(name).set(int(w.health.breaker.state(now)))
            m.in_flight.labels(name).set(self.load.local(name)[0])
            m.index_blocks.labels(name).set(self.index.size(name))
