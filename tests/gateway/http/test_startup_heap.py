"""Start-up freezes the heap once everything is loaded, and it is thawed when start-up's objects
are dropped (engines/heap.py).

The real app under real uvicorn in this process (the freeze is process-wide, so the test can see
it): nothing is frozen before start-up, objects are frozen once `/health` says ready, the gateway
still answers, and shutdown gives them back to the collector.
"""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path

import httpx
import pytest
import uvicorn

from engines import heap
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.servers import free_port, wait_health


@pytest.mark.integration
def test_the_heap_is_frozen_once_the_gateway_is_ready(tmp_path: Path) -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    port = free_port()
    repo = tmp_path / "models"
    repo.mkdir()
    app = create_app(Settings(host="127.0.0.1", http_port=port, grpc_port=0, model_repository=repo))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_health(f"http://127.0.0.1:{port}", 200, 60)
        assert gc.get_freeze_count() > 1000  # the modules, settings and app are in the permanent generation
        assert httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5).status_code == 200
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert gc.get_freeze_count() == 0 and not heap.frozen()  # shutdown thawed it


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_a_cycle_through_a_frozen_object_is_collected_once_thawed() -> None:
    """Why the restart and unload paths thaw: a frozen cycle is never collected."""
    node = _Node()
    ref = weakref.ref(node)
    heap.freeze()
    try:
        del node
        gc.collect()
        assert ref() is not None  # frozen: kept, however often the collector runs
        heap.thaw()
        heap.thaw()  # idempotent
        gc.collect()
        assert ref() is None
    finally:
        heap.thaw()
