"""The OpenAI surface through the gateway to real vLLM workers, each compared with vLLM itself:
logprobs (chat and completions, streamed and not), seeded sampling, n > 1, tool calls made by
vLLM's tool parser, and response_format. The tiny model has random weights, so every
check is against the worker's own answer or a structural invariant, never against prose."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.integration.conftest import MODEL, Worker
from tests.servers import Server

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

CHAT = [{"role": "user", "content": "Tell me about the weather in a few words."}]
GREEDY = {"temperature": 0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}


def sdk(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _direct(workers: list[Worker], name: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    worker = next(w for w in workers if w.name == name)
    r = httpx.post(worker.url + path, json={"model": MODEL, **body}, headers=worker.headers, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_logprobs_match_the_worker(gateway: Server, workers: list[Worker]) -> None:
    raw = sdk(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT, logprobs=True, top_logprobs=2, **GREEDY)
    r = raw.parse()
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens == 8
    assert all(len(e.top_logprobs) == 2 for e in entries)
    direct = _direct(workers, raw.headers["x-sluice-worker"], "/v1/chat/completions", {
        "messages": CHAT, "logprobs": True, "top_logprobs": 2, "temperature": 0, "max_tokens": 8,
        "ignore_eos": True})["choices"][0]["logprobs"]["content"]
    assert [e.token for e in entries] == [e["token"] for e in direct]
    assert [e.logprob for e in entries] == pytest.approx([e["logprob"] for e in direct], abs=1e-4)


def test_chat_logprobs_stream_as_content_lists(gateway: Server) -> None:
    stream = sdk(gateway).chat.completions.create(model=MODEL, messages=CHAT, logprobs=True, top_logprobs=1,
                                                  stream=True, **GREEDY)
    entries = [e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(entries) == 8 and all(e.top_logprobs for e in entries)


def test_completion_logprobs_are_parallel_arrays(gateway: Server, workers: list[Worker]) -> None:
    prompt = "The weather today is"
    raw = sdk(gateway).completions.with_raw_response.create(model=MODEL, prompt=prompt, logprobs=2, **GREEDY)
    r = raw.parse()
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    direct = _direct(workers, raw.headers["x-sluice-worker"], "/v1/completions", {
        "prompt": prompt, "logprobs": 2, "temperature": 0, "max_tokens": 8, "ignore_eos": True})
    assert lp.tokens == direct["choices"][0]["logprobs"]["tokens"]
    assert lp.token_logprobs == pytest.approx(direct["choices"][0]["logprobs"]["token_logprobs"], abs=1e-4)
    streamed = sdk(gateway).completions.create(model=MODEL, prompt=prompt, logprobs=2, stream=True, **GREEDY)
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == lp.tokens


def test_seeded_sampling_is_reproducible_and_n_fans_out(gateway: Server) -> None:
    c = sdk(gateway)
    kw = {"model": MODEL, "messages": CHAT, "temperature": 1.0, "max_tokens": 12, "seed": 7,
          "extra_body": {"ignore_eos": True}}
    first = c.chat.completions.create(**kw).choices[0].message.content
    again = c.chat.completions.create(**kw).choices[0].message.content
    assert first == again
    many = c.chat.completions.create(n=3, **kw)
    assert [ch.index for ch in many.choices] == [0, 1, 2]
    assert many.choices[0].message.content == first  # choice i samples with seed + i
    assert len({ch.message.content for ch in many.choices}) > 1
    assert many.usage.completion_tokens == 36


def test_tool_calls_from_vllms_parser_pass_through(gateway: Server) -> None:
    """vLLM's hermes parser turns the model's `<tool_call>` text into `tool_calls`; the random
    model is made to write exactly that text with vLLM's own structured outputs (a vLLM
    extra the gateway forwards), so the parser, not the weights, decides the outcome."""
    kw: dict[str, Any] = {
        "model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER_TOOL],
        "tool_choice": "auto", "max_tokens": 60, "temperature": 0,
        "extra_body": {"structured_outputs": {"choice": [HERMES_CALL]}}}
    r = sdk(gateway).chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather" and calls[0].id
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    chunks = list(sdk(gateway).chat.completions.create(stream=True, **kw))
    fragments = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls
                 for tc in c.choices[0].delta.tool_calls]
    assert fragments[0].function.name == "get_weather" and fragments[0].id
    assert json.loads("".join(f.function.arguments or "" for f in fragments)) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_response_format_reaches_the_worker(gateway: Server, workers: list[Worker]) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "yn", "schema": schema}}
    messages = [{"role": "user", "content": "Is it raining?"}]
    raw = sdk(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, response_format=fmt)
    text = raw.parse().choices[0].message.content
    direct = _direct(workers, raw.headers["x-sluice-worker"], "/v1/chat/completions", {
        "messages": messages, "max_tokens": 12, "temperature": 0, "response_format": fmt})
    free = _direct(workers, raw.headers["x-sluice-worker"], "/v1/chat/completions", {
        "messages": messages, "max_tokens": 12, "temperature": 0})
    assert text == direct["choices"][0]["message"]["content"]
    # The constraint applied: the output opens a JSON object, which the free output does not.
    assert text.startswith("{") and free["choices"][0]["message"]["content"] != text
