"""The gateway in front of two real vLLM workers, driven by the official OpenAI SDK."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.integration.conftest import BLOCK, MODEL, Worker
from tests.integration.vllm_support import EngineBrake, generation_tokens, hung_up_while_stopped
from tests.integration.vllm_support import metric_value as vllm_metric
from tests.servers import Server, metric_value

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three rivers."}]


def sdk(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _by_name(workers: list[Worker], name: str) -> Worker:
    return next(w for w in workers if w.name == name)


def test_models_come_from_workers(gateway: Server) -> None:
    assert [m.id for m in sdk(gateway).models.list()] == [MODEL]


def test_chat_stream_equals_direct_worker_call(gateway: Server, workers: list[Worker]) -> None:
    raw = sdk(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT, temperature=0, max_tokens=16, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    worker = _by_name(workers, raw.headers["x-sluice-worker"])
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    direct = httpx.post(worker.url + "/v1/chat/completions", timeout=120, headers=worker.headers, json={
        "model": MODEL, "messages": CHAT, "temperature": 0, "max_tokens": 16, "ignore_eos": True}).json()
    assert text == direct["choices"][0]["message"]["content"]
    assert chunks[-1].usage.prompt_tokens == direct["usage"]["prompt_tokens"]
    assert chunks[-1].usage.completion_tokens == 16


def test_gateway_token_count_equals_engine_prompt_tokens(gateway: Server) -> None:
    tok = httpx.post(gateway.url + "/tokenize", json={"model": MODEL, "messages": CHAT}).json()
    r = sdk(gateway).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)
    assert r.usage.prompt_tokens == tok["count"]


def test_completions_with_text_and_token_ids(gateway: Server, workers: list[Worker]) -> None:
    c = sdk(gateway)
    ids = list(range(500, 540))
    raw = c.completions.with_raw_response.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0,
                                                 extra_body={"ignore_eos": True})
    worker = _by_name(workers, raw.headers["x-sluice-worker"])
    direct = httpx.post(worker.url + "/v1/completions", timeout=120, headers=worker.headers, json={
        "model": MODEL, "prompt": ids, "max_tokens": 8, "temperature": 0, "ignore_eos": True}).json()
    assert raw.parse().choices[0].text == direct["choices"][0]["text"]
    streamed = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0,
                                    stream=True, extra_body={"ignore_eos": True})
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices)


def test_cached_tokens_reach_the_client(gateway: Server) -> None:
    ids = [3000 + (i * 17) % 9000 for i in range(2 * BLOCK + 20)]
    c = sdk(gateway)
    first = c.completions.create(model=MODEL, prompt=ids, max_tokens=1)
    second = c.completions.create(model=MODEL, prompt=ids, max_tokens=1)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == 2 * BLOCK


async def test_disconnect_aborts_on_the_vllm_worker(gateway: Server, workers: list[Worker]) -> None:
    async with httpx.AsyncClient(timeout=120) as http:
        worker, before = await _hang_up_mid_stream(http, gateway, workers)
        running = 1.0
        for _ in range(100):
            text = (await http.get(worker.url + "/metrics")).text
            running = vllm_metric(text, "vllm:num_requests_running")
            if running == 0:
                break
            await asyncio.sleep(0.1)
        generated = generation_tokens((await http.get(worker.url + "/metrics")).text) - before
    assert running == 0
    assert generated < 1900  # vLLM stopped early: the request was aborted, it did not run to the end


async def _hang_up_mid_stream(http: httpx.AsyncClient, gateway: Server, workers: list[Worker]
                              ) -> tuple[Worker, float]:
    """Open a long stream with the engines braked (see `EngineBrake`), hold its worker's engine
    still once it has sent a token, drop the connection once the answer has gone quiet (certainly
    mid-answer), then let the engine run. Returns the worker and its generated-token count from
    just before that stream's request. If the answer ended instead of going quiet, the scenario is
    set up again, and that answer is not counted."""
    with EngineBrake([w.proc.pid for w in workers]) as brake:
        for attempt in range(3):
            before = await _idle_generation_tokens(http, workers)
            body = {"model": MODEL, "prompt": list(range(700 + attempt, 740)), "max_tokens": 1900,
                    "ignore_eos": True, "stream": True}
            async with http.stream("POST", gateway.url + "/v1/completions", json=body) as r:
                worker = _by_name(workers, r.headers["x-sluice-worker"])
                lines = r.aiter_lines()
                while not (line := await anext(lines)).startswith("data: {"):
                    pass
                assert '"finish_reason":null' in line
                if await hung_up_while_stopped(r, lines, brake, worker.proc.pid):
                    return worker, before[worker.name]
            # the whole answer had been written out before the hold
    raise AssertionError("the answer kept finishing before its engine could be stopped")


async def _idle_generation_tokens(http: httpx.AsyncClient, workers: list[Worker]) -> dict[str, float]:
    """Each worker's generated-token count once nothing runs on any of them (bounded wait), so that
    an answer still finishing is counted in full before a new request starts."""
    for _ in range(100):
        texts = [(await http.get(w.url + "/metrics")).text for w in workers]
        if all(vllm_metric(t, "vllm:num_requests_running") == 0 for t in texts):
            break
        await asyncio.sleep(0.1)
    return {w.name: generation_tokens(t) for w, t in zip(workers, texts, strict=True)}


def _kv_events(gateway: Server, workers: list[Worker]) -> dict[str, float]:
    text = httpx.get(gateway.url + "/metrics").text
    return {w.name: metric_value(text, "sluice_router_kv_events_total", {"worker": w.name}) or 0 for w in workers}


def test_gateway_decodes_kv_events_from_both_workers(gateway: Server, workers: list[Worker]) -> None:
    # The gateway is shared by the whole session: earlier tests' traffic already
    # moved the counters, so only the increase since this test began counts.
    before = _kv_events(gateway, workers)
    rr = sdk(gateway).with_options(default_headers={"X-Routing-Policy": "round_robin"})
    ids = [6000 + (i * 31) % 8000 for i in range(BLOCK + 5)]  # one full block, unseen by either worker
    served = {rr.completions.with_raw_response.create(model=MODEL, prompt=ids, max_tokens=1)
              .headers["x-sluice-worker"] for _ in range(2)}
    assert served == {w.name for w in workers}  # round robin: one request on each worker
    deadline = time.monotonic() + 15
    grown: dict[str, float] = {}
    while time.monotonic() < deadline:
        grown = {name: n - before[name] for name, n in _kv_events(gateway, workers).items()}
        if all(v > 0 for v in grown.values()):
            break
        time.sleep(0.2)
    assert all(v > 0 for v in grown.values()), grown
