"""The gateway's process, GC and event-loop lag metrics: the lag monitor sees a loop that was blocked,
is restarted (and counted) when it fails, and a live gateway exports all three groups."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from gateway.telemetry.runtime import LoopLag
from tests.servers import metric_value, start_server

_STUCK_S = 10.0  # bounds a wait that should be over long before; a regression fails instead of hanging


def _count(registry: CollectorRegistry, le: str | None = None) -> float:
    if le is None:
        return registry.get_sample_value("sluice_event_loop_lag_seconds_count") or 0.0
    return registry.get_sample_value("sluice_event_loop_lag_seconds_bucket", {"le": le}) or 0.0


async def _until(condition: object) -> None:
    async with asyncio.timeout(_STUCK_S):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def test_a_blocked_loop_shows_as_lag_at_least_as_long_as_the_block() -> None:
    registry = CollectorRegistry()
    monitor = LoopLag(registry, interval_s=0.01)
    monitor.start()
    try:
        await _until(lambda: _count(registry) >= 1)  # it runs, and is asleep on its timer again
        before = _count(registry) - _count(registry, "0.1")
        time.sleep(0.3)  # noqa: ASYNC251 -- the point: a call that blocks the loop; its 10 ms timer runs after 300
        await _until(lambda: _count(registry) - _count(registry, "0.1") > before)
        assert registry.get_sample_value("sluice_event_loop_lag_last_seconds") is not None
    finally:
        await monitor.stop()


async def test_a_monitor_that_fails_is_restarted_and_counted() -> None:
    registry = CollectorRegistry()
    restarts: list[int] = []
    monitor = LoopLag(registry, interval_s=0.01, on_restart=lambda: restarts.append(1))
    real, calls = monitor.record, []

    def failing_once(lag_s: float) -> None:
        calls.append(lag_s)
        if len(calls) == 1:
            raise RuntimeError("a bug in the monitor")
        real(lag_s)

    monitor.record = failing_once  # type: ignore[method-assign]
    monitor.start()
    try:
        await _until(lambda: restarts and _count(registry) >= 1)  # restarted, and measuring again
    finally:
        await monitor.stop()
    assert restarts == [1]


@pytest.mark.integration
def test_a_live_gateway_exports_process_gc_and_loop_lag_metrics(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    server = start_server(["--model-repository", str(tmp_path / "repo")], tmp_path / "server.log")
    try:
        deadline = time.monotonic() + _STUCK_S
        while True:  # the monitor samples every 0.25 s from start-up
            text = httpx.get(server.url + "/metrics").text
            if (metric_value(text, "sluice_event_loop_lag_seconds_count") or 0) > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        server.stop()
    assert (metric_value(text, "sluice_event_loop_lag_seconds_count") or 0) > 0
    assert (metric_value(text, "process_resident_memory_bytes") or 0) > 0
    assert (metric_value(text, "process_open_fds") or 0) > 0
    assert metric_value(text, "python_gc_collections_total", {"generation": "0"}) is not None
