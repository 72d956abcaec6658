"""Anthropic's Messages API through the gateway to real vLLM workers, driven by the official
`anthropic` SDK: messages, streams, a tool-use round trip made by vLLM's hermes tool parser, and
count_tokens against the prompt tokens the engine reports. The tiny model has random weights, so
checks are structural or against what the engine itself reports, never against prose; vLLM's
`ignore_eos` and `structured_outputs` extras (which Sluice's Messages route takes, as its chat
does) make its output long enough, or the tool-call text the parser reads."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.integration.conftest import MODEL
from tests.servers import Server

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

GREEDY: dict[str, Any] = {"temperature": 0, "ignore_eos": True}  # current SDKs: sampling through extra_body
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                            "required": ["city"], "additionalProperties": False}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def sdk(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def _engine_prompt_tokens(message: Any) -> int:
    return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def test_create_stream_and_count_tokens(gateway: Server) -> None:
    c = sdk(gateway)
    system = "You answer briefly."
    r = c.messages.create(model=MODEL, max_tokens=8, system=system, messages=ASK, extra_body=GREEDY)
    assert r.content[0].type == "text" and r.stop_reason == "max_tokens" and r.usage.output_tokens == 8
    counted = c.messages.count_tokens(model=MODEL, system=system, messages=ASK).input_tokens
    assert counted == _engine_prompt_tokens(r)
    with c.messages.stream(model=MODEL, max_tokens=8, system=system, messages=ASK, extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == r.content[0].text == final.content[0].text
    assert final.usage.output_tokens == r.usage.output_tokens and _engine_prompt_tokens(final) == counted


def test_a_tool_use_round_trip(gateway: Server) -> None:
    """vLLM's hermes parser turns the model's `<tool_call>` text (forced with vLLM's structured
    outputs) into a tool call, which reaches the client as a tool_use block; the tool's result
    goes back, and the worker renders the same prompt the gateway counted and routed on."""
    c = sdk(gateway)
    forced = {"temperature": 0, "structured_outputs": {"choice": [HERMES_CALL]}}
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 60, "tools": [WEATHER], "tool_choice": {"type": "auto"},
                          "extra_body": forced}
    r = c.messages.create(messages=ASK, **kw)
    uses = [b for b in r.content if b.type == "tool_use"]
    assert r.stop_reason == "tool_use" and len(uses) == 1, [b.model_dump() for b in r.content]
    assert uses[0].name == "get_weather" and uses[0].input == {"city": "Paris"} and uses[0].id
    with c.messages.stream(messages=ASK, **kw) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert "content_block_delta" in events and final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in streamed] == [(b.name, b.input) for b in uses]
    result = {"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 21 C"}
    turn2 = [*ASK, {"role": "assistant", "content": [u.model_dump(exclude_none=True) for u in uses]},
             {"role": "user", "content": [result]}]
    answer = c.messages.create(model=MODEL, max_tokens=6, tools=[WEATHER], messages=turn2, extra_body=GREEDY)
    assert answer.usage.output_tokens == 6 and answer.stop_reason == "max_tokens"
    counted = c.messages.count_tokens(model=MODEL, tools=[WEATHER], messages=turn2).input_tokens
    assert counted == _engine_prompt_tokens(answer) > _engine_prompt_tokens(r)
