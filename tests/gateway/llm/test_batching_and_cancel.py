"""Continuous batching and cancellation on the real transformers engine."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.servers import LLM_NAME, Server, metric_value

pytestmark = pytest.mark.integration

PROMPTS = ["What is 2+2?", "Name a color.", "What is the capital of France?", "Say hi.",
           "Name a fruit.", "What is the opposite of hot?"]


def _generated(server: Server) -> float:
    text = httpx.get(server.url + "/metrics").text
    return metric_value(text, "sluice_generation_tokens_total", {"model": LLM_NAME}) or 0.0


def _metric(server: Server, name: str) -> float:
    value = metric_value(httpx.get(server.url + "/metrics").text, name, {"model": LLM_NAME})
    assert value is not None, name
    return value


async def _stream(c: openai.AsyncOpenAI, prompt: str) -> str:
    stream = await c.chat.completions.create(model=LLM_NAME, messages=[{"role": "user", "content": prompt}],
                                             temperature=0, max_tokens=24, stream=True)
    return "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])


async def test_concurrent_streams_share_a_batch_and_match_solo_runs(llm_server: Server) -> None:
    c = openai.AsyncOpenAI(base_url=llm_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    alone = [await _stream(c, p) for p in PROMPTS]
    # A per-test figure: the server is shared, so a session-wide maximum would prove nothing here.
    before = _metric(llm_server, "sluice_engine_batched_steps_total")
    together = await asyncio.gather(*[_stream(c, p) for p in PROMPTS])
    assert _metric(llm_server, "sluice_engine_batched_steps_total") > before
    assert together == alone
    assert all(text for text in alone)


async def test_disconnect_aborts_engine_request(llm_server: Server) -> None:
    body = {"model": LLM_NAME, "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 500, "temperature": 0, "ignore_eos": True, "stream": True}
    generated_before = _generated(llm_server)
    async with httpx.AsyncClient(base_url=llm_server.url, timeout=120) as http, \
            http.stream("POST", "/v1/chat/completions", json=body) as r:
        seen = 0
        async for line in r.aiter_lines():
            if line.startswith("data: ") and '"content"' in line:
                seen += 1
            if seen >= 3:
                break
        assert _metric(llm_server, "sluice_engine_requests_running") >= 1
    # leaving the block closed the connection mid-stream
    deadline = time.monotonic() + 120  # only bounds a request that never ends
    while _metric(llm_server, "sluice_engine_requests_running") > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert _metric(llm_server, "sluice_engine_requests_running") == 0
    assert _generated(llm_server) - generated_before < 500  # aborted, not run to max_tokens
    assert _metric(llm_server, "sluice_requests_inflight") == 0
    # The engine still serves after the abort.
    c = openai.AsyncOpenAI(base_url=llm_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    assert await _stream(c, "Say hi.")
