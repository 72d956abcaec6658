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

The admin routes call ``add_worker``, ``remove_worker``, ``drain``,
``workers()`` and ``models()``. ``await router.start()`` runs the background
drivers (health checks, metric scrapes, KV-event subscribers) and the
shared-state sync; ``await router.stop()`` ends them. Without ``start()`` the
router still routes (on dispatch bookkeeping and speculative entries only),
which is what unit tests use; they feed what the drivers would through
``router.feed``.

Not thread-safe: every method must be called from the event loop that called
``start()``. No method here blocks on I/O.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from router import policies
from router.config import POLICIES, RouterConfig, WorkerInfo
from router.cost import TtftFeatures, attention_pairs, features, predict_ttft
from router.index.hashing import block_hashes, cacheable_blocks, prompt_key, root_hash
from router.replicas.sync import ReplicaSync
from router.shared import SharedState
from router.state import RouterState, WorkerEntry
from router.state_metrics import RouterStateCollector
from router.telemetry.drivers import Drivers, WorkerFeed
from router.telemetry.metrics import RouterMetrics
from router.types import NoWorkerError, Ranking, WorkerStatus

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Dispatch:
    worker: str
    predicted_cached_tokens: int
    block_size: int
    new_hashes: list[int]  # speculative entries this dispatch added, rolled back if it fails
    dispatched_at: float
    features: TtftFeatures  # what the cost knew at dispatch: the TTFT observation's regressors
    predicted_ttft_s: float
    model: str = ""
    resume: bool = False  # an answer moved from a lost worker: its first token is no TTFT observation
    first_token: bool = False


class Router:
    """Chooses workers for LLM requests and learns from the outcome.

    `metrics` are the router's Prometheus series on `registry` (a private
    registry by default, so two routers in one process do not clash).
    """

    def __init__(self, config: RouterConfig, registry: CollectorRegistry | None = None,
                 shared: SharedState | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        registry = registry or CollectorRegistry()
        self.metrics = RouterMetrics(registry, config.accuracy_window)
        self._state = RouterState(config, self.metrics, shared, clock)
        registry.register(RouterStateCollector(self._state))
        self._shared = shared
        self._dispatches: dict[str, _Dispatch] = {}
        self._rr_turn = 0
        self._drivers: Drivers | None = None

    @property
    def feed(self) -> WorkerFeed:
        """Where the drivers report what workers do; another event source may report here too."""
        return self._state

    # -- workers -------------------------------------------------------------
    def add_worker(self, info: WorkerInfo) -> None:
        """Register (or replace the description of) a worker; routable at once."""
        self._state.add(info)
        if self._drivers is not None:
            self._drivers.restart_worker(info)

    def remove_worker(self, name: str) -> None:
        """Forget a worker and its index entries. In-flight requests still finish normally."""
        if self._drivers is not None and name in self._state.workers:
            self._drivers.stop_worker(name)
        self._state.remove(name)

    def drain(self, name: str, draining: bool = True) -> None:
        """Stop (or resume) giving `name` new requests; in-flight ones finish. KeyError if unknown."""
        self._state.workers[name].health.draining = draining

    def workers(self) -> list[WorkerStatus]:
        s = self._state
        now = s.clock()
        out = []
        for w in s.workers.values():
            load = s.load.snapshot(w.info.name, now)  # this replica's requests and the others' it was told of
            out.append(WorkerStatus(w.info.name, w.info.url, w.info.models, w.info.engine, w.block_size,
                                    w.health.healthy, w.health.draining, w.health.breaker.state(now),
                                    load.in_flight, load.queued_prefill_tokens, s.index.size(w.info.name),
                                    w.info.has_events))
        return out

    def models(self) -> list[str]:
        """Model ids served by at least one registered worker."""
        return sorted({m for w in self._state.workers.values() for m in w.info.models})

    # -- routing -------------------------------------------------------------
    def rank(self, model: str, token_ids: Sequence[int], *, policy: str | None = None,
             session_key: str | None = None, lora: str | None = None,
             cache_salt: str | None = None) -> Ranking:
        """Rank the workers serving `model` for this prompt, best first.

        Raises ValueError for an unknown policy or invalid token ids, and
        NoWorkerError when no non-draining worker serves `model`. Mutates only
        the round-robin turn, the decision metrics and expired index entries.
        """
        started = time.perf_counter()
        ranking = self._rank(model, token_ids, policy or self.config.policy, session_key, lora, cache_salt)
        self.metrics.decisions.labels(ranking.policy, ranking.best.reason).inc()
        self.metrics.decision.observe(time.perf_counter() - started)
        return ranking

    def _rank(self, model: str, token_ids: Sequence[int], policy: str, session_key: str | None,
              lora: str | None, cache_salt: str | None) -> Ranking:
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; choose one of {', '.join(POLICIES)}")
        s = self._state
        cands = [w for w in s.workers.values() if model in w.info.models and not w.health.draining]
        if not cands:
            raise NoWorkerError(f"no worker serves model {model!r}")
        now = s.clock()
        root = root_hash(model, lora, cache_salt)
        # A worker that is not sent the salt caches (and reports events) under the unsalted root.
        shared = [w for w in cands if not w.info.salted_cache] if cache_salt is not None else []
        chains = {size: tuple(block_hashes(token_ids, size, root))
                  for size in {w.block_size for w in cands if not shared or w.info.salted_cache}}
        shared_chains = {size: tuple(block_hashes(token_ids, size, root_hash(model, lora)))
                         for size in {w.block_size for w in shared}} if shared else None
        matched = s.index.match({w.info.name: (chains if shared_chains is None or w.info.salted_cache
                                               else shared_chains)[w.block_size] for w in cands}, now)
        n = len(token_ids)
        views = [_view(w, cacheable_blocks(n, matched[w.info.name], w.block_size) * w.block_size,
                       s, now) for w in cands]
        if policy == "round_robin":
            self._rr_turn += 1
        ranked = policies.rank(policy, views, prompt_tokens=n, tie_key=prompt_key(token_ids, root),
                               turn=self._rr_turn, session_key=session_key, tolerance=s.learn.relative_error,
                               answer_tokens=s.learn.answer_tokens(model))
        return Ranking(model, policy, n, tuple(ranked), chains, shared_chains)

    def on_dispatch(self, request_id: str, ranking: Ranking, worker: str, *, resume: bool = False) -> None:
        """`request_id` is being sent to `worker` (one of `ranking`'s candidates).

        Adds speculative index entries for the prompt on `worker`, counts the
        request in flight, and makes it the probe of a half-open breaker. A `resume`
        (an answer moved from a lost worker) is priced and counted like any prompt, but its
        first token is not an observation of the worker's TTFT. Raises KeyError for an unknown worker.
        """
        s = self._state
        w = s.workers[worker]
        now = s.clock()
        cand = ranking.candidate(worker)
        predicted = cand.predicted_cached_tokens if cand else 0
        if request_id in self._dispatches:  # a retry: the previous attempt was not finished
            self.on_finish(request_id, error=True)
        chain = ranking.chain(w.block_size, w.info.salted_cache)
        uncached = max(0, ranking.prompt_tokens - predicted)
        model = s.learn.model(worker)
        f = features(s.load.snapshot(worker, now), uncached, predicted)
        ttft_s = predict_ttft(model, f)
        # Speculative entries stand for blocks the engine will hold once this prefill ran: they last
        # until then (as predicted) and `speculative_ttl_s` more, for the KV events to arrive.
        ttl_s = self.config.speculative_ttl_s if w.info.has_events else self.config.approx_ttl_s
        new = s.index.store(worker, chain, expires_at=now + ttft_s + ttl_s)
        if self._shared is not None and chain:
            self._shared.publish_store(worker, chain, ttft_s + ttl_s)
        s.load.dispatch(worker, request_id, uncached, attention_pairs(uncached, predicted))
        cached_blocks = predicted // w.block_size
        s.load.expect(request_id, chain[cached_blocks:], cached_blocks, w.block_size)
        w.health.breaker.on_dispatch(now)
        self._dispatches[request_id] = _Dispatch(worker, predicted, w.block_size, new, now, f, ttft_s,
                                                 ranking.model, resume=resume)
        self.metrics.predicted_ttft.labels(worker).observe(ttft_s)

    def on_first_token(self, request_id: str) -> None:
        """The first token of `request_id` arrived: its prefill no longer queues on the worker, and
        the time since its dispatch is an observation of the worker's TTFT."""
        s = self._state
        s.load.first_token(request_id)
        d = self._dispatches.get(request_id)
        if d is None or d.first_token:
            return
        d.first_token = True
        now = s.clock()
        if (w := s.workers.get(d.worker)) is not None:
            w.health.note_alive(now)
        if d.resume:
            return
        actual_s = now - d.dispatched_at
        s.learn.observe_ttft(d.worker, d.features, actual_s, d.predicted_ttft_s)
        self.metrics.observe_ttft(d.worker, d.predicted_ttft_s, actual_s)

    def mark_down(self, name: str) -> None:
        """`name` was lost mid-answer (its connection failed, or it went silent): unhealthy and its
        breaker open at once, so no request is ranked there until a health check and a probe pass.
        Unknown names are ignored."""
        w = self._state.workers.get(name)
        if w is not None:
            w.health.mark_down(self._state.clock())

    def on_finish(self, request_id: str, *, cached_tokens: int | None = None, error: bool = False,
                  completion_tokens: int | None = None) -> None:
        """The dispatch of `request_id` ended.

        `cached_tokens` is the engine's ``usage.prompt_tokens_details.cached_tokens``
        (None if it did not say). `completion_tokens` is what it generated, for an answer that
        ran to its end (None otherwise): it feeds the model's mean answer length. Set `error`
        only for worker faults (connection refused, 5xx, broken stream), not for 4xx answers or
        client disconnects: it feeds the circuit breaker. Unknown ids are ignored.
        """
        d = self._dispatches.pop(request_id, None)
        if d is None:
            return
        s = self._state
        s.load.finish(request_id)
        w = s.workers.get(d.worker)
        if w is not None:
            if error:
                w.health.breaker.record_failure(s.clock())
                # The engine never got these blocks; do not predict hits from them.
                s.index.remove(d.worker, d.new_hashes, speculative_only=True)
            else:
                w.health.breaker.record_success()
                if completion_tokens is not None:  # an answer that ran to its end (not a disconnect)
                    w.health.note_alive(s.clock())
        if cached_tokens is not None and not error:
            self.metrics.observe_prediction(d.predicted_cached_tokens, cached_tokens, d.block_size)
        if completion_tokens is not None and not error:
            s.learn.observe_answer(d.model, completion_tokens)
            self.metrics.answer_tokens.labels(d.model).set(s.learn.answer_tokens(d.model))

    # -- lifecycle -------------------------------------------------------------
    async def start(self) -> None:
        """Start health checks, scrapes, KV-event subscribers and shared-state sync."""
        if self._drivers is not None:
            return
        drivers = Drivers(self.config, self._state)
        self._drivers = drivers
        for w in self._state.workers.values():
            drivers.restart_worker(w.info)
        drivers.start()
        if self._shared is not None:
            await self._shared.start(ReplicaSync(self._state))

    async def stop(self) -> None:
        """Stop every background task; safe to call twice."""
        drivers, self._drivers = self._drivers, None
        if drivers is not None:
            await drivers.stop()
        if self._shared is not None:
            try:
                await self._shared.stop()
            except Exception:  # stopping must finish; a backend that fails to close says so in the log
                log.exception("shared routing state did not stop cleanly")


def _view(w: WorkerEntry, predicted_cached_tokens: int, s: RouterState, now: float) -> policies.WorkerView:
    name = w.info.name
    return policies.WorkerView(name, predicted_cached_tokens, s.load.snapshot(name, now), w.health.available(now),
                               s.learn.model(name), s.kv_pressure(w), w.info.max_num_seqs)


__all__ = ["NoWorkerError", "Ranking", "Router", "WorkerStatus"]
