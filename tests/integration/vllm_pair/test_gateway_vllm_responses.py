"""OpenAI's Responses API through the gateway to real vLLM workers, driven by the official `openai`
SDK: create and stream, a function-tool round trip made by vLLM's hermes parser, and an agent loop
of 20 turns chained by `previous_response_id` that stays on the worker holding its growing prefix,
whose cached tokens (as the engine reports them) grow with it. The tiny model has random weights:
checks are structural or against what the engine reports, never against prose."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.integration.conftest import MODEL
from tests.servers import Server

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
BLOCK = 128  # the workers' KV block size


def sdk(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_create_and_stream(gateway: Server) -> None:
    c = sdk(gateway)
    kw: dict[str, Any] = {"model": MODEL, "input": "Tell me about the weather.", "temperature": 0,
                          "max_output_tokens": 8, "extra_body": {"ignore_eos": True}}
    r = c.responses.create(**kw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 8 and r.output_text
    with c.responses.stream(**kw) as stream:  # an incomplete response ends with response.incomplete
        events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1]
    assert final.type == "response.incomplete" and final.response.incomplete_details.reason == "max_output_tokens"
    assert text == final.response.output_text == r.output_text
    assert final.response.usage.input_tokens == r.usage.input_tokens
    got = c.responses.retrieve(r.id)  # kept by the gateway: vLLM keeps none
    assert got.output_text == r.output_text and got.usage.output_tokens == 8
    c.responses.delete(r.id)  # the SDK returns nothing for a delete
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)


def test_a_function_tool_round_trip(gateway: Server) -> None:
    """vLLM's hermes parser turns the model's `<tool_call>` text (forced with vLLM's structured
    outputs, an extra Sluice takes as on chat) into a function_call item; its output goes back
    through previous_response_id."""
    c = sdk(gateway)
    forced = {"structured_outputs": {"choice": [HERMES_CALL]}}
    r = c.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER], temperature=0,
                           max_output_tokens=60, extra_body=forced)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    with c.responses.stream(model=MODEL, input="Weather in Paris?", tools=[WEATHER], temperature=0,
                            max_output_tokens=60, extra_body=forced) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert [(o.name, o.arguments) for o in final.output if o.type == "function_call"] == [
        (calls[0].name, calls[0].arguments)]
    answer = c.responses.create(model=MODEL, previous_response_id=r.id, tools=[WEATHER], temperature=0,
                                max_output_tokens=6, extra_body={"ignore_eos": True}, input=[
                                    {"type": "function_call_output", "call_id": calls[0].call_id,
                                     "output": "Sunny, 21 C"}])
    assert answer.output[0].type == "message" and answer.usage.output_tokens == 6
    assert answer.usage.input_tokens > r.usage.input_tokens  # the first turn and the tool's output rendered
    items = c.responses.input_items.list(answer.id).data
    assert [(i.type, i.call_id) for i in items] == [("function_call_output", calls[0].call_id)]


def test_an_agent_loop_stays_on_the_worker_holding_its_prefix(gateway: Server) -> None:
    """20 turns, each adding a tool-sized observation to the conversation: every turn after the
    first lands on the first turn's worker, and the engine reports nearly all of the previous turn's
    prompt as cached (all but the last, partial KV block)."""
    c = sdk(gateway)
    previous, first_worker, prompts, cached = None, None, [], []
    for turn in range(20):
        raw = c.responses.with_raw_response.create(
            model=MODEL, previous_response_id=previous, temperature=0, max_output_tokens=1,
            input=f"Observation {turn}: " + " ".join(f"reading-{turn}-{k}" for k in range(12)))
        r = raw.parse()
        worker = raw.headers["x-sluice-worker"]
        first_worker = first_worker or worker
        assert worker == first_worker, (turn, worker, first_worker, raw.headers.get("x-sluice-route-reason"))
        prompts.append(r.usage.input_tokens)
        cached.append(r.usage.input_tokens_details.cached_tokens)
        previous = r.id
    assert prompts == sorted(prompts) and prompts[-1] < 2048
    for k in range(1, 20):
        assert cached[k] >= cached[k - 1] and cached[k] >= prompts[k - 1] - BLOCK, (k, prompts, cached)
    assert cached[-1] > cached[1]
