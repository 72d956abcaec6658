"""Start-up freezes the heap once everything is loaded (gateway/startup.py, `_freeze_heap`).

The real app under real uvicorn in this process (the freeze is process-wide, so the test can see
it): nothing is frozen before start-up, objects are frozen once `/health` says ready, and the
gateway still answers afterwards.
"""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from gateway.app import create_app
from gateway.settings import Settings
from tests.servers import free_port


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
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        else:
            raise AssertionError("the gateway never became ready")
        assert gc.get_freeze_count() > 1000  # the modules, settings and app are in the permanent generation
        assert httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5).status_code == 200
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        gc.unfreeze()  # the rest of the test run collects as usual
