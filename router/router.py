"""The router facade the gateway calls.

Per LLM request the gateway calls, on one asyncio event loop:

1. ``ranking = router.rank(model, token_ids, ...)`` -- ordered candidates;
2. ``router.on_dispatch(request_id, ranking, worker)`` right before sending to
   ``worker`` (no ``await`` in between, so a half-open breaker admits exactly
   one probe);
3. ``router.on_first_token(request_id)`` when the first token arrives;
4. ``router.on_finish(request_id, cached_tokens=..., error=...)`` exactly once
   per dispatch. On a failure before the first byte, call ``on_finish(...,
   error=True)`` and dispatch the same request id to the next candidate.

``await router.start()`` runs the background drivers (health checks, metric
scrapes, KV-event subscribers, shared-state sync); ``await router.stop()``
ends them. Without ``start()`` the router still routes (on dispatch
bookkeeping and speculative entries only), which is what unit tests use.

Not thread-safe: every method must be called from the event loop that called
``start()``. No method here blocks on I/O.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from router import policies
from router.config import POLICIES, RouterConfig, WorkerInfo
from router.events import BlockRemoved, BlockStored, EventApplier, EventBatch, KVEvent
from router.hashing import block_hashes, cacheable_blocks, prompt_key, root_hash
from router.health import CircuitBreaker, WorkerHealth
from router.index import EXACT, PrefixIndex
from router.load import LoadTracker, ScrapedMetrics
from router.metrics import RouterMetrics
from router.shared import SharedState
from router.types import NoWorkerError, Ranking, WorkerStatus

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Worker:
    info: WorkerInfo
    health: WorkerHealth
    applier: EventApplier
    block_size: int


@dataclass(slots=True)
class _Dispatch:
    worker: str
    predicted_cached_tokens: int
    block_size: int
    new_hashes: list[int]


class Router:
    """Chooses workers for LLM requests and learns from the outcome."""

    def __init__(self, config: RouterConfig, registry: CollectorRegistry | None = None,
                 shared: SharedState | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._index = PrefixIndex(config.max_blocks_per_worker)
        self._load = LoadTracker(config.scrape_stale_s)
        # A private registry by default: two routers in one process must not clash.
        self.metrics = RouterMetrics(registry or CollectorRegistry(), config.accuracy_window)
        self._shared = shared
        self._workers: dict[str, _Worker] = {}
        self._dispatches: dict[str, _Dispatch] = {}
        self._rr_turn = 0
        self._event_fed: set[str] = set()  # workers whose events this replica applied itself
        self._drivers: object | None = None  # router.drivers.Drivers while started

    # -- workers -------------------------------------------------------------
    def add_worker(self, info: WorkerInfo) -> None:
        """Register (or replace the description of) a worker; routable at once."""
        old = self._workers.get(info.name)
        c = self.config
        health = old.health if old else WorkerHealth(
            c.unhealthy_after_failures,
            CircuitBreaker(c.breaker_failures, c.breaker_cooldown_s, c.breaker_max_cooldown_s))
        # Keep the engine->router hash map across a re-registration, or removals of
        # blocks stored before it could no longer be applied.
        applier = (old.applier if old and old.info.models == info.models
                   else EventApplier(info.name, info.models, self._index, c.max_blocks_per_worker))
        block_size = info.block_size or (old.block_size if old else c.default_block_size)
        w = _Worker(info, health, applier, block_size)
        self._workers[info.name] = w
        capacity = None if info.has_events else (info.capacity_blocks or c.approx_capacity_blocks)
        self._index.add_worker(info.name, capacity)
        if self._drivers is not None:
            self._drivers.restart_worker(w)  # type: ignore[attr-defined]

    def remove_worker(self, name: str) -> None:
        """Forget a worker and its index entries. In-flight requests still finish normally."""
        if self._workers.pop(name, None) is None:
            return
        if self._drivers is not None:
            self._drivers.stop_worker(name)  # type: ignore[attr-defined]
        self._index.remove_worker(name)
        self._event_fed.discard(name)
        self._load.forget(name)
        self.metrics.forget_worker(name)

    def drain(self, name: str, draining: bool = True) -> None:
        """Stop (or resume) giving `name` new requests; in-flight ones finish. KeyError if unknown."""
        self._workers[name].health.draining = draining

    def workers(self) -> list[WorkerStatus]:
        now = self._clock()
        out = []
        for w in self._workers.values():
            inflight, queued = self._load.local(w.info.name)
            out.append(WorkerStatus(w.info.name, w.info.url, w.info.models, w.info.engine, w.block_size,
                                    w.health.healthy, w.health.draining, w.health.breaker.state(now),
                                    inflight, queued, self._index.size(w.info.name), w.info.has_events))
        return out

    def models(self) -> list[str]:
        """Model ids served by at least one registered worker."""
        return sorted({m for w in self._workers.values() for m in w.info.models})

    # -- routing -------------------------------------------------------------
    def rank(self, model: str, token_ids: Sequence[int], *, policy: str | None = None,
             session_key: str | None = None, lora: str | None = None,
             cache_salt: str | None = None) -> Ranking:
        """Rank the workers serving `model` for this prompt, best first.

        Raises ValueError for an unknown policy or invalid token ids, and
        NoWorkerError when no non-draining worker serves `model`. Mutates only
        the round-robin turn, the decision counter and expired index entries.
        """
        policy = policy or self.config.policy
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; choose one of {', '.join(POLICIES)}")
        cands = [w for w in self._workers.values() if model in w.info.models and not w.health.draining]
        if not cands:
            raise NoWorkerError(f"no worker serves model {model!r}")
        now = self._clock()
        root = root_hash(model, lora, cache_salt)
        chains: dict[int, tuple[int, ...]] = {}
        for w in cands:
            if w.block_size not in chains:
                chains[w.block_size] = tuple(block_hashes(token_ids, w.block_size, root))
        matched = self._index.match({w.info.name: chains[w.block_size] for w in cands}, now)
        n = len(token_ids)
        views = [policies.WorkerView(
            w.info.name, cacheable_blocks(n, matched[w.info.name], w.block_size) * w.block_size,
            self._load.snapshot(w.info.name, now), w.health.available(now)) for w in cands]
        if policy == "round_robin":
            self._rr_turn += 1
        ranked = policies.rank(policy, views, prompt_tokens=n, weights=self.config.weights,
                               tie_key=prompt_key(token_ids, root), turn=self._rr_turn,
                               session_key=session_key)
        self.metrics.decisions.labels(policy, ranked[0].reason).inc()
        return Ranking(model, policy, n, tuple(ranked), chains)

    def on_dispatch(self, request_id: str, ranking: Ranking, worker: str) -> None:
        """`request_id` is being sent to `worker` (one of `ranking`'s candidates).

        Adds speculative index entries for the prompt on `worker`, counts the
        request in flight, and makes it the probe of a half-open breaker.
        Raises KeyError for an unknown worker.
        """
        w = self._workers[worker]
        now = self._clock()
        cand = ranking.candidate(worker)
        predicted = cand.predicted_cached_tokens if cand else 0
        if request_id in self._dispatches:  # a retry: the previous attempt was not finished
            self.on_finish(request_id, error=True)
        chain = ranking.chains.get(w.block_size, ())
        ttl_s = self.config.speculative_ttl_s if w.info.has_events else self.config.approx_ttl_s
        new = self._index.store(worker, chain, expires_at=now + ttl_s)
        if self._shared is not None and chain:
            self._shared.publish_store(worker, chain, ttl_s)
        self._load.dispatch(worker, request_id, ranking.prompt_tokens - predicted)
        w.health.breaker.on_dispatch(now)
        self._dispatches[request_id] = _Dispatch(worker, predicted, w.block_size, new)

    def on_first_token(self, request_id: str) -> None:
        """The first token of `request_id` arrived: its prefill no longer queues on the worker."""
        self._load.first_token(request_id)

    def on_finish(self, request_id: str, *, cached_tokens: int | None = None, error: bool = False) -> None:
        """The dispatch of `request_id` ended.

        `cached_tokens` is the engine's ``usage.prompt_tokens_details.cached_tokens``
        (None if it did not say). Set `error` only for worker faults (connection
        refused, 5xx, broken stream), not for 4xx answers or client disconnects:
        it feeds the circuit breaker. Unknown ids are ignored.
        """
        d = self._dispatches.pop(request_id, None)
        if d is None:
            return
        self._load.finish(request_id)
        w = self._workers.get(d.worker)
        if w is not None:
            if error:
                w.health.breaker.record_failure(self._clock())
                # The engine never got these blocks; do not predict hits from them.
                self._index.remove(d.worker, d.new_hashes, speculative_only=True)
            else:
                w.health.breaker.record_success()
        if cached_tokens is not None and not error:
            self.metrics.observe_prediction(d.predicted_cached_tokens, cached_tokens, d.block_size)

    # -- learning from workers (called by the drivers; public for other feeds) --
    def apply_kv_batch(self, worker: str, batch: EventBatch) -> None:
        """Apply a vLLM event batch from `worker`; unknown workers are ignored."""
        self.apply_kv_events(worker, batch.events)
        self.metrics.kv_lag.labels(worker).set(max(0.0, time.time() - batch.ts))

    def apply_kv_events(self, worker: str, events: Iterable[KVEvent]) -> None:
        w = self._workers.get(worker)
        if w is None:
            return
        n = 0
        self._event_fed.add(worker)
        for ev in events:
            n += 1
            if isinstance(ev, BlockRemoved):
                gone = w.applier.removed_router_hashes(ev)
                w.applier.apply(ev)
                if self._shared is not None and gone:
                    self._shared.publish_remove(worker, gone)
            elif isinstance(ev, BlockStored):
                stored = w.applier.apply(ev)
                if self._shared is not None and stored:
                    self._shared.publish_store(worker, stored, None)
            else:
                w.applier.apply(ev)
                if self._shared is not None:
                    self._shared.publish_clear(worker, False)
        if w.info.block_size is None and w.applier.observed_block_size:
            w.block_size = w.applier.observed_block_size
        self.metrics.kv_events.labels(worker).inc(n)

    def reset_kv_state(self, worker: str) -> None:
        """Event continuity for `worker` was lost: drop its exact entries, keep speculative ones."""
        w = self._workers.get(worker)
        if w is None:
            return
        w.applier.reset()
        if self._shared is not None:
            self._shared.publish_clear(worker, True)

    def apply_scrape(self, worker: str, m: ScrapedMetrics) -> None:
        """Record a /metrics scrape; learns block size and capacity unless configured."""
        w = self._workers.get(worker)
        if w is None:
            return
        self._load.set_scraped(worker, m, self._clock())
        if w.info.block_size is None and m.block_size:
            w.block_size = m.block_size
        if not w.info.has_events and w.info.capacity_blocks is None and m.num_gpu_blocks:
            self._index.set_capacity(worker, m.num_gpu_blocks)

    def record_health_check(self, worker: str, ok: bool) -> None:
        w = self._workers.get(worker)
        if w is not None:
            w.health.record_check(ok)

    def refresh_metrics(self) -> None:
        """Update the per-worker gauges (the drivers call this every second)."""
        now = self._clock()
        for name, w in self._workers.items():
            self.metrics.healthy.labels(name).set(1 if w.health.available(now) else 0)
            self.metrics.breaker.labels(name).set(int(w.health.breaker.state(now)))
            self.metrics.in_flight.labels(name).set(self._load.local(name)[0])
            self.metrics.index_blocks.labels(name).set(self._index.size(name))
        if self._shared is not None:
            self.metrics.redis_up.set(1 if getattr(self._shared, "connected", False) else 0)

    def prune(self) -> int:
        """Drop expired speculative entries; returns how many."""
        return self._index.prune(self._clock())

    # -- ReplicaSink: changes from other gateway replicas -------------------
    def apply_remote_store(self, worker: str, hashes: Sequence[int], ttl_s: float | None) -> None:
        if worker in self._workers:
            self._index.store(worker, hashes, expires_at=EXACT if ttl_s is None else self._clock() + ttl_s)

    def apply_remote_remove(self, worker: str, hashes: Sequence[int]) -> None:
        self._index.remove(worker, hashes)

    def apply_remote_clear(self, worker: str, exact_only: bool) -> None:
        self._index.clear(worker, exact_only=exact_only)

    def set_remote_load(self, worker: str, in_flight: int, queued_prefill_tokens: int) -> None:
        self._load.set_remote(worker, in_flight, queued_prefill_tokens)

    def local_entries(self, worker: str) -> Iterable[tuple[int, float | None]]:
        now = self._clock()
        for h, exp in list(self._index.entries(worker)):
            if exp == EXACT:
                yield h, None
            elif exp > now:
                yield h, exp - now

    def local_loads(self) -> dict[str, tuple[int, int]]:
        return {name: self._load.local(name) for name in self._workers}

    def worker_names(self) -> list[str]:
        return list(self._workers)

    def event_workers(self) -> set[str]:
        return self._event_fed & set(self._workers)

    # -- lifecycle -------------------------------------------------------------
    async def start(self) -> None:
        """Start health checks, scrapes, KV-event subscribers and shared-state sync."""
        from router.drivers import Drivers

        if self._drivers is not None:
            return
        drivers = Drivers(self)
        self._drivers = drivers
        for w in self._workers.values():
            drivers.restart_worker(w)
        drivers.start()
        if self._shared is not None:
            await self._shared.start(self)

    async def stop(self) -> None:
        """Stop every background task; safe to call twice."""
        drivers, self._drivers = self._drivers, None
        if drivers is not None:
            await drivers.stop()  # type: ignore[attr-defined]
        if self._shared is not None:
            with contextlib.suppress(Exception):
                await self._shared.stop()


__all__ = ["Router", "Ranking", "NoWorkerError", "WorkerStatus"]
