"""The HTTP-facing steps against httpx mock transports, for what a real server cannot be made to do.

TRT-LLM needs an NVIDIA GPU, so its event drain is exercised against a stand-in
of trtllm-serve's `/kv_cache_events`. The vLLM /metrics and /health steps are
tested against a real vLLM in tests/integration/vllm_pair/test_vllm_metrics_health.py;
here only their error answers are.
"""

from __future__ import annotations

import httpx
import pytest

from router import Router, RouterConfig, WorkerInfo
from router.index.transports import TrtllmEventPoller
from router.telemetry.health import check_health
from router.telemetry.load import scrape_metrics
from tests.servers import free_port

TOKENS = list(range(1, 9))


def stored(eid, hashes, parent, tokens, size=4):
    blocks = [{"type": "stored_block", "block_hash": h, "cache_level": 0, "priority": 35,
               "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0}
                          for t in tokens[i * size:(i + 1) * size]]} for i, h in enumerate(hashes)]
    return {"event_id": eid, "data": {"type": "stored", "parent_hash": parent, "blocks": blocks},
            "window_size": 32}


class TrtllmStandIn:
    """Answers like trtllm-serve: POST /kv_cache_events drains the queue (GET gets 405)."""

    def __init__(self) -> None:
        self.queue: list[dict] = []
        self.methods: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.methods.append(request.method)
        if request.url.path != "/kv_cache_events":
            return httpx.Response(404)
        if request.method != "POST":
            return httpx.Response(405)
        out, self.queue = self.queue, []
        return httpx.Response(200, json=out)


async def test_trtllm_poller_applies_events_and_resets_on_gap():
    srv = TrtllmStandIn()
    r = Router(RouterConfig())
    r.add_worker(WorkerInfo("t", "http://127.0.0.1:1", ("m",), block_size=4, engine="trtllm",
                            trtllm_events=True))
    gaps: list[bool] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(srv)) as client:
        p = TrtllmEventPoller("t", "http://127.0.0.1:1", client, interval_s=1, timeout_s=1,
                              on_items=lambda items: r.feed.apply_kv_events(
                                  "t", [e for _, e in items if e is not None and not isinstance(e, int)]),
                              on_reset=lambda reason: r.feed.reset_kv_state("t", reason), on_gap=gaps.append)
        srv.queue = [{"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [64, 0]}},
                     stored(1, [501, 502], None, TOKENS)]
        assert await p.poll_once() == 2
        assert r.rank("m", [*TOKENS, 0]).best.predicted_cached_tokens == 8
        assert await p.poll_once() == 0  # drained
        srv.queue = [{"event_id": 2, "data": {"type": "removed", "block_hashes": [502]}}]
        await p.poll_once()
        assert r.rank("m", [*TOKENS, 0]).best.predicted_cached_tokens == 4
        srv.queue = [{"event_id": 9, "data": {"type": "removed", "block_hashes": []}}]  # 3..8 lost
        await p.poll_once()
        assert gaps == [False]
        assert r.rank("m", [*TOKENS, 0]).best.predicted_cached_tokens == 0
    assert set(srv.methods) == {"POST"}


async def test_trtllm_poller_falls_back_to_get():
    def get_only(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=[]) if request.method == "GET" else httpx.Response(405)

    async with httpx.AsyncClient(transport=httpx.MockTransport(get_only)) as client:
        p = TrtllmEventPoller("t", "http://127.0.0.1:1", client, interval_s=1, timeout_s=1,
                              on_items=lambda items: None, on_reset=lambda reason: None)
        assert await p.poll_once() == 0


async def test_health_is_false_for_error_answers_and_refused_connections():
    # A real vLLM answers /health 200 (tests/integration/vllm_pair/test_vllm_metrics_health.py); only
    # a mock can answer 503 on demand. Refusal is real: nothing listens on the port.
    def unhealthy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503)

    async with httpx.AsyncClient(transport=httpx.MockTransport(unhealthy)) as client:
        assert not await check_health(client, "http://127.0.0.1:9", 1)
    async with httpx.AsyncClient(timeout=60) as client:
        assert not await check_health(client, f"http://127.0.0.1:{free_port()}", 1)


async def test_scrape_raises_for_error_answers_and_non_prometheus_text():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "127.0.0.1":
            return httpx.Response(500)
        return httpx.Response(200, text="<html>a proxy's error page</html>")

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(httpx.HTTPStatusError):
            await scrape_metrics(client, "http://127.0.0.1:9", 1)
        with pytest.raises(ValueError):
            await scrape_metrics(client, "http://127.0.0.2:9", 1)
