"""Background tasks that feed the router: the only part of `router/` that loops on I/O.

Per worker: an active health check, a /metrics scrape (vLLM workers), and a
KV-event subscriber (ZMQ for vLLM, polling for TRT-LLM). Plus one maintenance
task that prunes expired index entries and refreshes gauges once a second.
Every loop is an asyncio task cancelled by `stop()`. A worker being down is
the normal case these loops exist for and raises nothing; anything else that
escapes a loop (a bug, a closed socket) is logged with its traceback, counted
(`record_task_restart`, exported as `sluice_background_task_restarts_total`)
and the loop is started again after a bounded backoff (`engines.supervision`).

The drivers know a worker only by its :class:`~router.config.WorkerInfo` and
report everything they learn through a :class:`WorkerFeed`; they never see
the router itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import httpx

from engines.supervision import BackgroundTask, Backoff
from router.config import RouterConfig, WorkerInfo
from router.index.events import EventBatch, KVEvent
from router.index.transports import TrtllmEventPoller, TrtllmItem, ZmqEventSubscriber
from router.telemetry.health import check_health
from router.telemetry.load import ScrapedMetrics, scrape_metrics

log = logging.getLogger(__name__)
_MAINTENANCE_INTERVAL_S = 1.0
_RESTART_BACKOFF = Backoff(initial_s=0.5, max_s=30.0)
# Engines whose /metrics speak vLLM's names (running, waiting, KV usage, cache config): scraped for load.
_VLLM_METRICS_ENGINES = ("vllm", "sim")


class WorkerFeed(Protocol):
    """What the drivers report into (`router.state.RouterState`).

    Every call runs on the drivers' event loop, returns at once, and ignores a
    worker name it does not know (a report racing a removal). None raises for
    what a worker sent.
    """

    def apply_kv_batch(self, worker: str, batch: EventBatch) -> None:
        """A vLLM event batch, in sequence order; updates the index and the event-lag gauge."""

    def apply_kv_events(self, worker: str, events: Sequence[KVEvent]) -> None:
        """Events without a batch (TRT-LLM), in order."""

    def reset_kv_state(self, worker: str, reason: str) -> None:
        """Event continuity was lost: the worker's exact index entries can no longer be trusted.
        `reason` is one of `router.telemetry.metrics.KV_RESET_REASONS` (a metric label)."""

    def record_kv_gap(self, worker: str, filled: bool) -> None:
        """A sequence gap in the worker's events; `filled` if replay recovered every missed batch."""

    def record_health_check(self, worker: str, ok: bool) -> None: ...

    def apply_scrape(self, worker: str, metrics: ScrapedMetrics) -> None:
        """One /metrics scrape: running and waiting requests, KV usage, cache config."""

    def maintain(self) -> None:
        """Periodic housekeeping: drop expired speculative entries, refresh per-worker gauges."""

    def record_task_restart(self, task: str, worker: str) -> None:
        """A background loop (`task`, for `worker` or "" for none) failed and is being restarted."""


class Drivers:
    """The background tasks of one router; `start`, `restart_worker` and `stop` run on its event loop."""

    def __init__(self, config: RouterConfig, feed: WorkerFeed) -> None:
        self._config = config
        self._feed = feed
        key = config.worker_key
        self._client = httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"} if key else None)
        self._tasks: dict[str, list[BackgroundTask]] = {}
        self._maintenance: BackgroundTask | None = None
        self._subscribers: dict[str, ZmqEventSubscriber | TrtllmEventPoller] = {}

    def start(self) -> None:
        self._maintenance = self._spawn("maintenance", "", self._maintain)

    def restart_worker(self, info: WorkerInfo) -> None:
        """(Re)start the tasks of one worker, e.g. after its description changed."""
        name = info.name
        self.stop_worker(name)
        tasks = [self._spawn("health", name, lambda: self._health_loop(name, info.url))]
        if self._config.scrape_interval_s > 0 and info.engine in _VLLM_METRICS_ENGINES:
            tasks.append(self._spawn("scrape", name, lambda: self._scrape_loop(name, info.url)))
        sub = self._subscriber(info)
        if sub is not None:
            self._subscribers[name] = sub
            tasks.append(self._spawn("kv-events", name, lambda: self._kv_events(info)))
        self._tasks[name] = tasks

    def _spawn(self, task: str, worker: str, run: Callable[[], Awaitable[None]]) -> BackgroundTask:
        label = f"{task}-{worker}" if worker else f"router-{task}"
        spawned = BackgroundTask(label, run, backoff=_RESTART_BACKOFF,
                                 on_restart=lambda: self._feed.record_task_restart(task, worker))
        spawned.start()
        return spawned

    async def _kv_events(self, info: WorkerInfo) -> None:
        """Run the worker's subscriber; after a failure closed its socket, a fresh one is made."""
        sub = self._subscribers.get(info.name)
        if sub is None or sub.closed:
            sub = self._subscriber(info)
            if sub is None:
                return
            self._subscribers[info.name] = sub
        await sub.run()

    def _subscriber(self, info: WorkerInfo) -> ZmqEventSubscriber | TrtllmEventPoller | None:
        cfg, feed, name = self._config, self._feed, info.name
        if info.kv_events_endpoint is not None:
            return ZmqEventSubscriber(
                name, info.kv_events_endpoint, bind=info.kv_events_bind,
                on_batch=lambda b: feed.apply_kv_batch(name, b),
                on_reset=lambda reason: feed.reset_kv_state(name, reason),
                on_gap=lambda filled: feed.record_kv_gap(name, filled),
                replay_endpoint=info.kv_events_replay_endpoint, topic=info.kv_events_topic,
                replay_timeout_s=cfg.replay_timeout_s)
        if info.trtllm_events:
            return TrtllmEventPoller(
                name, info.url, self._client, interval_s=cfg.trtllm_poll_interval_s,
                timeout_s=cfg.scrape_timeout_s, on_items=lambda items: self._trtllm_items(name, items),
                on_reset=lambda reason: feed.reset_kv_state(name, reason),
                on_gap=lambda filled: feed.record_kv_gap(name, filled))
        return None

    def _trtllm_items(self, name: str, items: list[TrtllmItem]) -> None:
        # Capacity ints (from "created") and unused event kinds (None) carry no index change.
        events = [ev for _, ev in items if ev is not None and not isinstance(ev, int)]
        self._feed.apply_kv_events(name, events)

    def stop_worker(self, name: str) -> None:
        for t in self._tasks.pop(name, []):
            t.cancel()
        sub = self._subscribers.pop(name, None)
        if isinstance(sub, ZmqEventSubscriber):
            sub.close()  # a bound endpoint must be free again for a re-registration

    async def stop(self) -> None:
        tasks = [t for ts in self._tasks.values() for t in ts]
        if self._maintenance is not None:
            tasks.append(self._maintenance)
        await asyncio.gather(*(t.stop() for t in tasks))
        for sub in self._subscribers.values():
            if isinstance(sub, ZmqEventSubscriber):
                sub.close()
        self._subscribers.clear()
        self._tasks.clear()
        await self._client.aclose()

    async def _health_loop(self, name: str, url: str) -> None:
        cfg = self._config
        while True:
            ok = await check_health(self._client, url, cfg.health_timeout_s)
            self._feed.record_health_check(name, ok)
            await asyncio.sleep(cfg.health_interval_s)

    async def _scrape_loop(self, name: str, url: str) -> None:
        cfg = self._config
        while True:
            try:
                self._feed.apply_scrape(name, await scrape_metrics(self._client, url, cfg.scrape_timeout_s))
            except (httpx.HTTPError, ValueError) as e:
                log.debug("scrape of %s failed: %s", name, e)
            await asyncio.sleep(cfg.scrape_interval_s)

    async def _maintain(self) -> None:
        while True:
            try:
                self._feed.maintain()
            except Exception:  # a bug here must not stop routing; say so loudly
                log.exception("router maintenance failed")
            await asyncio.sleep(_MAINTENANCE_INTERVAL_S)
