"""`--metrics-port`: the registry on a port of its own, under the same key rule as /metrics;
and the in-process engine series, one per (model, worker)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from engines.base import EngineStats
from gateway.llm.metrics import EngineStatsCollector
from tests.servers import free_port, start_server

KEY = "sk-metrics-port-test-0123456789"


@pytest.mark.integration
def test_metrics_port_needs_the_key_when_metrics_do(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    port = free_port()
    server = start_server(["--model-repository", str(tmp_path / "repo"), "--metrics-port", str(port),
                           "--metrics-require-key"], tmp_path / "gateway.log", env={"SLUICE_ADMIN_KEYS": KEY})
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        refused = httpx.get(url, timeout=10)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert KEY not in refused.text
        assert httpx.get(url, headers={"Authorization": "Bearer sk-wrong"}, timeout=10).status_code == 401
        ok = httpx.get(url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        assert ok.status_code == 200 and "sluice_auth_failures_total" in ok.text
        assert httpx.head(url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 404
        assert httpx.get(server.url + "/metrics", timeout=10).status_code == 401  # the API port's rule is the same
    finally:
        server.stop()


def test_engine_series_are_labelled_by_worker() -> None:
    registry = CollectorRegistry()
    stats = [("m", "local", EngineStats(running=2, waiting=1, max_batch_size_seen=3)),
             ("m", "other", EngineStats(running=5, waiting=0, max_batch_size_seen=5))]
    registry.register(EngineStatsCollector(lambda: stats))
    text = generate_latest(registry).decode()
    assert 'sluice_engine_requests_running{model="m",worker="local"} 2.0' in text
    assert 'sluice_engine_requests_running{model="m",worker="other"} 5.0' in text
