"""Background tasks that feed the router: the only part of `router/` that loops on I/O.

Per worker: an active health check, a /metrics scrape, and a KV-event
subscriber (ZMQ for vLLM, polling for TRT-LLM). Plus one maintenance task
that prunes expired index entries and refreshes gauges. Every loop is a plain
asyncio task cancelled by `stop()`; none lets an exception escape (a worker
being down is the normal case these loops exist for).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import httpx

from router.health import check_health
from router.kv_events import TrtllmEventPoller, ZmqEventSubscriber
from router.load import scrape_metrics

if TYPE_CHECKING:
    from router.router import Router, _Worker

log = logging.getLogger(__name__)


class Drivers:
    def __init__(self, router: Router) -> None:
        self._router = router
        self._client = httpx.AsyncClient()
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._maintenance: asyncio.Task[None] | None = None
        self.subscribers: dict[str, ZmqEventSubscriber | TrtllmEventPoller] = {}

    def start(self) -> None:
        self._maintenance = asyncio.create_task(self._maintain(), name="router-maintenance")

    def restart_worker(self, w: _Worker) -> None:
        """(Re)start the tasks of one worker, e.g. after its description changed."""
        name = w.info.name
        self.stop_worker(name)
        cfg = self._router.config
        tasks = [asyncio.create_task(self._health_loop(name, w.info.url), name=f"health-{name}")]
        if cfg.scrape_interval_s > 0 and w.info.engine == "vllm":
            tasks.append(asyncio.create_task(self._scrape_loop(name, w.info.url), name=f"scrape-{name}"))
        sub = self._subscriber(w)
        if sub is not None:
            self.subscribers[name] = sub
            tasks.append(asyncio.create_task(sub.run(), name=f"kv-events-{name}"))
        self._tasks[name] = tasks

    def _subscriber(self, w: _Worker) -> ZmqEventSubscriber | TrtllmEventPoller | None:
        info, cfg, r = w.info, self._router.config, self._router
        name = info.name
        if info.kv_events_endpoint is not None:
            return ZmqEventSubscriber(
                name, info.kv_events_endpoint, bind=info.kv_events_bind,
                on_batch=lambda b: r.apply_kv_batch(name, b), on_reset=lambda: r.reset_kv_state(name),
                on_gap=lambda filled: self._gap(name, filled),
                replay_endpoint=info.kv_events_replay_endpoint, topic=info.kv_events_topic,
                replay_timeout_s=cfg.replay_timeout_s)
        if info.trtllm_events:
            return TrtllmEventPoller(
                name, info.url, self._client, interval_s=cfg.trtllm_poll_interval_s,
                timeout_s=cfg.scrape_timeout_s, on_items=lambda items: self._trtllm_items(name, items),
                on_reset=lambda: r.reset_kv_state(name), on_gap=lambda filled: self._gap(name, filled))
        return None

    def _gap(self, name: str, filled: bool) -> None:
        self._router.metrics.kv_gaps.labels(name).inc()
        if filled:
            self._router.metrics.kv_replays.labels(name).inc()

    def _trtllm_items(self, name: str, items: list) -> None:  # type: ignore[type-arg]
        events = [ev for _, ev in items if ev is not None and not isinstance(ev, int)]
        self._router.apply_kv_events(name, events)

    def stop_worker(self, name: str) -> None:
        for t in self._tasks.pop(name, []):
            t.cancel()
        sub = self.subscribers.pop(name, None)
        if isinstance(sub, ZmqEventSubscriber):
            sub.close()  # a bound endpoint must be free again for a re-registration

    async def stop(self) -> None:
        tasks = [t for ts in self._tasks.values() for t in ts]
        if self._maintenance is not None:
            tasks.append(self._maintenance)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sub in self.subscribers.values():
            if isinstance(sub, ZmqEventSubscriber):
                sub.close()
        self.subscribers.clear()
        self._tasks.clear()
        await self._client.aclose()

    async def _health_loop(self, name: str, url: str) -> None:
        cfg = self._router.config
        while True:
            ok = await check_health(self._client, url, cfg.health_timeout_s)
            self._router.record_health_check(name, ok)
            await asyncio.sleep(cfg.health_interval_s)

    async def _scrape_loop(self, name: str, url: str) -> None:
        cfg = self._router.config
        while True:
            try:
                self._router.apply_scrape(name, await scrape_metrics(self._client, url, cfg.scrape_timeout_s))
            except (httpx.HTTPError, ValueError) as e:
                log.debug("scrape of %s failed: %s", name, e)
            await asyncio.sleep(cfg.scrape_interval_s)

    async def _maintain(self) -> None:
        r = self._router
        while True:
            try:
                r.prune()
                r.refresh_metrics()
            except Exception:  # a bug here must not stop routing; say so loudly
                log.exception("router maintenance failed")
            await asyncio.sleep(1.0)
