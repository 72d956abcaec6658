"""Remote LLM workers: the pool of registered workers, and routing through `router.Router`.

A worker is an OpenAI-compatible engine server (vLLM, trtllm-serve, or
`sluice worker --engine transformers`). Each gets one `RemoteEngine`; each model
served by workers gets a `RoutedBackend` that asks the router for an ordered
ranking and reports dispatch, first token and outcome back to it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from engines.base import EngineRequest, LLMEngine
from engines.errors import ErrorKind, SluiceError
from engines.launchers.registration import WorkerRecord
from engines.remote import RemoteEngine, RemoteEngineConfig
from engines.remote.payload import SALTED_DIALECTS
from engines.supervision import BackgroundTask
from engines.text.tokenizer import ChatTokenizer
from engines.weights import resolve_llm
from gateway.llm.capacity import frontend_share, model_capacity
from gateway.llm.registry import ModelRegistry
from gateway.llm.targets import RouteHints, Target
from gateway.llm.workers.probe import context_length, discover_kv_events, engine_capacity, model_cards
from router import Candidate, NoWorkerError, Router, WorkerInfo

log = logging.getLogger("sluice.workers")
_CAPACITY_REFRESH_S = 1.0  # how soon a model's admission limits follow a worker's health

_DIALECTS = {"vllm": "vllm", "sim": "vllm", "trtllm": "trtllm", "transformers": "openai", "sluice": "openai",
             "openai": "openai"}


def worker_info(record: WorkerRecord, models: tuple[str, ...], capacity: int | None = None) -> WorkerInfo:
    """The router's view of a registered worker. Only a worker whose dialect is sent the tenant's
    `cache_salt` has its prefixes matched on the salted chain; the others' caches are shared."""
    events = record.kv_events_endpoint
    trtllm = record.engine == "trtllm" and bool(events) and str(events).startswith("http")
    return WorkerInfo(
        name=record.name, url=record.url.rstrip("/"), models=models, block_size=record.block_size,
        engine=record.engine, kv_events_endpoint=None if trtllm else events,
        kv_events_replay_endpoint=None if trtllm else record.kv_events_replay_endpoint,
        trtllm_events=trtllm, salted_cache=_DIALECTS[record.engine] in SALTED_DIALECTS, max_num_seqs=capacity,
    )


class RoutedBackend:
    """All workers serving one model, ranked per request by the router."""

    shared = True

    def __init__(self, model: str, pool: WorkerPool) -> None:
        self.model = model
        self.pool = pool

    def rank(self, request: EngineRequest, hints: RouteHints) -> list[Target]:
        router = self.pool.router
        try:
            ranking = router.rank(self.model, request.prompt_token_ids, policy=hints.policy,
                                  session_key=hints.session_key, lora=request.lora,
                                  cache_salt=request.cache_salt)
        except NoWorkerError as e:
            raise SluiceError(str(e), ErrorKind.NO_WORKER, retry_after_s=1.0) from None
        except ValueError as e:  # unknown X-Routing-Policy
            raise SluiceError(str(e), ErrorKind.INVALID_ARG, param="X-Routing-Policy") from None
        rid = request.request_id
        # One pair of hooks for all the targets: a stream holds its ranking until its first token.
        on_first_token = partial(router.on_first_token, rid)

        def on_finish(cached: int | None, failed: bool, answered: int | None) -> None:
            router.on_finish(rid, cached_tokens=cached, error=failed, completion_tokens=answered)

        targets = []
        for cand in ranking.candidates:
            engine = self.pool.engines.get(cand.worker)
            if engine is None:
                continue
            targets.append(Target(cand.worker, engine, cand.predicted_cached_tokens, cand.reason, cand.predicted_ttft_s,
                                  on_dispatch=partial(router.on_dispatch, rid, ranking, cand.worker,
                                                      resume=hints.resume),
                                  on_first_token=on_first_token, on_finish=on_finish,
                                  on_lost=partial(router.mark_down, cand.worker)))
        if not targets:
            raise SluiceError(f"no healthy worker serves model `{self.model}`", ErrorKind.NO_WORKER,
                              retry_after_s=1.0)
        if hints.prefer_worker and (hints.policy or router.config.policy) == "prefix":
            return _prefer(targets, ranking.candidates, hints.prefer_worker)
        return targets

    def engines(self) -> Sequence[tuple[str, LLMEngine]]:
        return [(w.name, self.pool.engines[w.name]) for w in self.pool.router.workers()
                if self.model in w.models and w.name in self.pool.engines]

    def ready(self) -> bool:
        return any(w.healthy and not w.draining for w in self.pool.router.workers() if self.model in w.models)


# How much slower (predicted seconds) the previous turn's worker may be than the best and still get
# the turn: its cache holds the conversation even where the index cannot see it yet (a prefix
# shorter than a KV block, events in flight), its load may be a scrape older than the turn that
# just ended there, and moving a conversation costs its whole prefill. Only a clear advantage
# (half as fast again and a quarter second) moves it.
PREFER_SLACK_S, PREFER_SLACK_RATIO = 0.25, 0.5


def _prefer(targets: list[Target], candidates: Sequence[Candidate], worker: str) -> list[Target]:
    costs = {c.worker: c.cost for c in candidates}
    best = min(costs.get(t.name, float("inf")) for t in targets)
    mine = next((t for t in targets if t.name == worker), None)
    if mine is None or targets[0] is mine or costs.get(worker, float("inf")) > best * (1 + PREFER_SLACK_RATIO) + \
            PREFER_SLACK_S:
        return targets
    return [replace(mine, reason="previous_response"), *(t for t in targets if t is not mine)]


class WorkerPool:
    """Owns the RemoteEngines and keeps the router and the LLM service in step: each model's
    capacity (gateway.llm.capacity) is recomputed when a worker comes or goes, and every
    `_CAPACITY_REFRESH_S` while any is registered, so admission follows the router's health view."""

    def __init__(self, registry: ModelRegistry, router: Router, repository: Path | None, *,
                 stall_timeout_s: float = 60.0, read_interval_s: float = 0.0, worker_key: str | None = None,
                 frontend: tuple[int, int] = (0, 1)) -> None:
        self.registry = registry
        self.router = router
        self.repository = repository
        self.stall_timeout_s = stall_timeout_s
        self.read_interval_s = read_interval_s
        self.worker_key = worker_key  # sent to every worker; never logged
        self.frontend = frontend  # (index, count) of `--frontends N`: this process admits its share
        self.engines: dict[str, RemoteEngine] = {}
        self.records: dict[str, WorkerRecord] = {}
        self.capacities: dict[str, int | None] = {}  # by worker; None: unknown (the default applies)
        self._lock = asyncio.Lock()
        self._refresher: BackgroundTask | None = None  # started with the first worker

    async def add(self, record: WorkerRecord) -> list[str]:
        """Register or replace a worker (a vLLM worker's KV-event endpoints read from it when the
        record has none); returns the model ids it serves.

        Raises SluiceError: UNAVAILABLE if the worker cannot be reached to list its models or
        refuses the worker key (code `probe.KEY_REFUSED`), ALREADY_EXISTS if a model is already
        served in-process."""
        record = await discover_kv_events(record, self.worker_key)
        async with self._lock:
            cards = await model_cards(record.url, self.worker_key)
            capacity = await engine_capacity(record, cards, self.worker_key)
            models = record.models or tuple(cards)
            for m in models:
                existing = self.registry.models.get(m)
                if existing is not None and not isinstance(existing.backend, RoutedBackend):
                    raise SluiceError(f"model `{m}` is served in-process by this gateway",
                                      ErrorKind.ALREADY_EXISTS, param="models")
            for m in models:
                if m not in self.registry.models:
                    tok = await asyncio.to_thread(self._tokenizer, m, record, cards.get(m, {}))
                    ctx = context_length(cards.get(m, {}))
                    self.registry.add(m, tok, ctx, RoutedBackend(m, self))
            # trtllm-serve lists its model under the path it loaded; the record's id is
            # what clients use, so requests must carry the worker's own id.
            served = next(iter(cards)) if record.models and len(cards) == 1 and not set(cards) & set(models) \
                else None
            old = self.engines.pop(record.name, None)
            engine = RemoteEngine(RemoteEngineConfig(record.url, name=record.name, served_model=served,
                                                     dialect=_DIALECTS[record.engine],  # type: ignore[arg-type]
                                                     stall_timeout_s=self.stall_timeout_s,
                                                     read_interval_s=self.read_interval_s,
                                                     api_key=self.worker_key,
                                                     priority=record.priority_scheduling))
            await engine.start()
            self.engines[record.name] = engine
            self.records[record.name] = record
            self.capacities[record.name] = capacity
            self.router.add_worker(worker_info(record, tuple(models), capacity))
            self.refresh_capacity()
            if old is not None:
                await old.stop()
            log.info("worker %s registered: %s (%s, capacity %s)", record.name, ", ".join(models), record.engine,
                     capacity or "unknown: the default")
            return list(models)

    async def remove(self, name: str) -> bool:
        async with self._lock:
            engine = self.engines.pop(name, None)
            self.records.pop(name, None)
            self.capacities.pop(name, None)
            if engine is None:
                return False
            self.router.remove_worker(name)
            served = set(self.router.models())
            for m in [m for m, model in self.registry.models.items()
                      if isinstance(model.backend, RoutedBackend) and m not in served]:
                self.registry.remove(m)
            self.refresh_capacity()
            await engine.stop()
            log.info("worker %s removed", name)
            return True

    async def stop(self) -> None:
        if self._refresher is not None:
            await self._refresher.stop()
            self._refresher = None
        for name in list(self.engines):
            await self.remove(name)

    def relay_counts(self) -> list[tuple[str, int, int]]:
        """(worker, events spliced, events decoded) of each registered worker (sluice_relay_events)."""
        return [(name, e.relay_counts.spliced, e.relay_counts.decoded) for name, e in self.engines.items()]

    def refresh_capacity(self) -> None:
        """Set each routed model's capacity from its workers that take requests now (limits follow)."""
        workers = self.router.workers()
        for name, model in list(self.registry.models.items()):
            if isinstance(model.backend, RoutedBackend):
                capacity = model_capacity(name, workers, self.capacities)
                self.registry.set_capacity(name, frontend_share(capacity, *self.frontend))
        if self._refresher is None and self.engines:
            self._refresher = BackgroundTask("sluice-capacity", self._refresh_forever)
            self._refresher.start()

    async def _refresh_forever(self) -> None:
        while True:  # a failed round is logged and the loop restarted by BackgroundTask
            await asyncio.sleep(_CAPACITY_REFRESH_S)
            self.refresh_capacity()

    def _tokenizer(self, model: str, record: WorkerRecord, card: dict[str, Any]) -> ChatTokenizer:
        """The model's own tokenizer, found locally: an explicit path or repository
        name, the model id itself, or the directory the worker reports as `root`."""
        tried = []
        for candidate in (record.tokenizer, model, card.get("root")):
            if not candidate:
                continue
            try:
                return ChatTokenizer(resolve_llm(str(candidate), self.repository))
            except (FileNotFoundError, ValueError, OSError) as e:
                tried.append(f"{candidate}: {e}")
        raise SluiceError(f"no local tokenizer for model `{model}` (tried {'; '.join(tried)}); register the "
                          "worker with a `tokenizer` path or repository model name", ErrorKind.INVALID_ARG,
                          param="tokenizer")
