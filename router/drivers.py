"""Background tasks that feed the router: the only part of `router/` that loops on I/O.

Per worker: an active health check, a /metrics scrape (vLLM workers), and a
KV-event subscriber (ZMQ for vLLM, polling for TRT-LLM). Plus one maintenance
task that prunes expired index entries and refreshes gauges once a second.
Every loop is a plain asyncio task cancelled by `stop()`; none lets an
exception escape (a worker being down is the normal case these loops exist for).

The drivers know a worker only by its :class:`~router.config.WorkerInfo` and
report everything they learn through a :class:`WorkerFeed`; they never see
the router itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

import httpx

from router.config import RouterConfig, WorkerInfo
from router.events import EventBatch, KVEvent
from router.health import check_health
from router.kv_events import TrtllmEventPoller, TrtllmItem, ZmqEventSubscriber
from router.load import ScrapedMetrics, scrape_metrics

log = logging.getLogger(__name__)
_MAINTENANCE_INTERVAL_S = 1.0


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

    def reset_kv_state(self, worker: str) -> None:
        """Event continuity was lost: the worker's exact index entries can no longer be trusted."""

    def record_kv_gap(self, worker: str, filled: bool) -> None:
        """A sequence gap in the worker's events; `filled` if replay recovered every missed batch."""

    def record_health_check(self, worker: str, ok: bool) -> None: ...

    def apply_scrape(self, worker: str, metrics: ScrapedMetrics) -> None:
        """One /metrics scrape: running and waiting requests, KV usage, cache config."""

    def maintain(self) -> None:
        """Periodic housekeeping: drop expired speculative entries, refresh per-worker gauges."""


class Drivers:
    """The background tasks of one router; `start`, `restart_worker` and `stop` run on its event loop."""

    def __init__(self, config: RouterConfig, feed: WorkerFeed) -> None:
        self._config = config
        self._feed = feed
        self._client = httpx.AsyncClient()
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._maintenance: asyncio.Task[None] | None = None
        self._subscribers: dict[str, ZmqEventSubscriber | TrtllmEventPoller] = {}

    def start(self) -> None:
        self._maintenance = asyncio.create_task(self._maintain(), name="router-maintenance")

    def restart_worker(self, info: WorkerInfo) -> None:
        """(Re)start the tasks of one worker, e.g. after its description changed."""
        name = info.name
        self.stop_worker(name)
        tasks = [asyncio.create_task(self._health_loop(name, info.url), name=f"health-{name}")]
        if self._config.scrape_interval_s > 0 and info.engine == "vllm":
            tasks.append(asyncio.create_task(self._scrape_loop(name, info.url), name=f"scrape-{name}"))
        sub = self._subscriber(info)
        if sub is not None:
            self._subscribers[name] = sub
            tasks.append(asyncio.create_task(sub.run(), name=f"kv-events-{name}"))
        self._tasks[name] = tasks

    def _subscriber(self, info: WorkerInfo) -> ZmqEventSubscriber | TrtllmEventPoller | None:
        cfg, feed, name = self._config, self._feed, info.name
        if info.kv_events_endpoint is not None:
            return ZmqEventSubscriber(
                name, info.kv_events_endpoint, bind=info.kv_events_bind,
                on_batch=lambda b: feed.apply_kv_batch(name, b), on_reset=lambda: feed.reset_kv_state(name),
                on_gap=lambda filled: feed.record_kv_gap(name, filled),
                replay_endpoint=info.kv_events_replay_endpoint, topic=info.kv_events_topic,
                replay_timeout_s=cfg.replay_timeout_s)
        if info.trtllm_events:
            return TrtllmEventPoller(
                name, info.url, self._client, interval_s=cfg.trtllm_poll_interval_s,
                timeout_s=cfg.scrape_timeout_s, on_items=lambda items: self._trtllm_items(name, items),
                on_reset=lambda: feed.reset_kv_state(name), on_gap=lambda filled: feed.record_kv_gap(name, filled))
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
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
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
