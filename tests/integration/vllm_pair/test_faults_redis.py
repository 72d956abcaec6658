"""redis-server stopped and started again under two gateway replicas (`--redis-url`).

Real processes: one redis-server of this module's own (it is killed), two `sluice serve`
replicas, the session's two vLLM workers. The workers are registered without KV events
(approximate mode), so what one replica knows about the other's requests can only have
come through Redis. While Redis is down both replicas keep serving on their local view;
the placement one of them makes meanwhile reaches the other once Redis is back, although
the restarted Redis is empty: the replicas push their views into it again.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import redis

from tests.integration.conftest import BLOCK, Worker
from tests.integration.vllm_pair.test_redis_replicas import _approx_gateway, _chat, _continue, _opening
from tests.servers import Server, free_port, metric_value

pytestmark = [
    pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed (make apt)"),
]


class RedisServer:
    """A throw-away redis-server on a fixed loopback port, without persistence."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(400):  # bounded wait for readiness
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited at start-up")
            try:
                if self.client().ping():
                    return
            except redis.RedisError:
                time.sleep(0.025)
        raise RuntimeError("redis-server did not become ready")

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _connected(server: Server) -> float | None:
    return metric_value(httpx.get(server.url + "/metrics", timeout=10).text, "sluice_router_redis_connected")


def _until(cond, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"never happened: {what}")


def _index(server: Server) -> dict[str, int]:
    rows = httpx.get(server.url + "/v1/admin/workers", timeout=10).json()["data"]
    return {w["name"]: int(w["index_blocks"]) for w in rows}


def test_replicas_serve_through_a_redis_outage_and_share_again_after_it(workers: list[Worker],
                                                                        tmp_path: Path) -> None:
    store = RedisServer()
    store.start()
    started: list[Server] = []
    try:
        a = _approx_gateway(workers, tmp_path / "a", "--redis-url", store.url)
        started.append(a)
        b = _approx_gateway(workers, tmp_path / "b", "--redis-url", store.url)
        started.append(b)
        _until(lambda: _connected(a) == 1 and _connected(b) == 1, "both replicas connected")

        store.stop()
        _until(lambda: _connected(a) == 0 and _connected(b) == 0, "both replicas saw Redis go")
        # Both keep serving on their local view, and stay healthy.
        messages = _opening("outage", 0)
        h1, first = _chat(a, messages)
        _chat(b, _opening("outage-b", 0))
        assert httpx.get(a.url + "/health").status_code == 200 and httpx.get(b.url + "/health").status_code == 200

        store.start()  # empty: no persistence
        _until(lambda: _connected(a) == 1 and _connected(b) == 1, "both replicas reconnected")
        # The replicas converge: each applies what the other routed while Redis was down.
        _until(lambda: _index(a) == _index(b), f"the replicas' indexes agree ({_index(a)} vs {_index(b)})")
        assert store.client().zcard(f"sluice:router:blocks:{h1['x-sluice-worker']}") > 0  # Redis repopulated

        h2, second = _chat(b, _continue(messages, first, 0))
        assert h2["x-sluice-worker"] == h1["x-sluice-worker"], (h1, h2)
        assert h2["x-sluice-route-reason"] == "prefix_hit", h2
        assert int(h2["x-sluice-predicted-cached-tokens"]) >= 3 * BLOCK
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 3 * BLOCK
    finally:
        for s in reversed(started):
            s.stop()
        store.stop()
