"""The Responses API's conversion onto a chat request, and its output items and events (pure)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from engines.base import Delta
from engines.errors import SluiceError
from gateway.openai.responses.convert import assistant_turn, input_items, to_chat
from gateway.openai.responses.events import Assembler
from gateway.openai.responses.schemas import MAX_ITEMS, ResponsesRequest


def request(**kw: object) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", **kw})


def test_items_become_chat_messages_and_instructions_lead_but_are_not_kept() -> None:
    history = [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "reply"}]
    chat, conversation = to_chat(request(instructions="Be brief.", input=[
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"role": "user", "content": [{"type": "input_text", "text": "And "}, {"type": "input_text", "text": "Rome?"}]},
    ], tools=[{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "get_weather"}), history)
    msgs = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "system", "assistant", "tool", "user"]
    assert msgs[0]["content"] == "Be brief." and msgs[6]["content"] == "And Rome?"
    assert [c["id"] for c in msgs[4]["tool_calls"]] == ["call_1", "call_2"] and msgs[4]["content"] == "Let me look."
    assert msgs[5] == {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}
    assert chat.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert conversation[0] == history[0] and all(m.get("content") != "Be brief." for m in conversation)


def test_a_string_input_is_one_user_message_and_its_item_gets_an_id() -> None:
    body = request(input="Hello", max_output_tokens=5, temperature=0.3, text={"format": {
        "type": "json_schema", "name": "x", "schema": {"type": "object"}}})
    chat, _ = to_chat(body, [])
    assert chat.messages[0].content == "Hello" and chat.max_tokens == 5 and chat.temperature == 0.3
    assert chat.response_format == {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"},
                                                                           "strict": None}}
    (item,) = input_items(body)
    assert item["id"].startswith("msg_") and item["content"] == [{"type": "input_text", "text": "Hello"}]


@pytest.mark.parametrize(("kw", "param"), [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input.0.content.0"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input.0.type"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": "hi", "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"input": [{"role": "system", "content": "only instructions"}]}, "input"),
])
def test_what_this_server_cannot_do_is_refused_by_name(kw: dict, param: str) -> None:
    with pytest.raises(SluiceError) as e:
        to_chat(request(**kw), [])
    assert e.value.param == param


@pytest.mark.parametrize("kw", [
    {"input": []} | {"input": [{"role": "user", "content": "x"}] * (MAX_ITEMS + 1)},
    {"input": "x", "max_output_tokens": 0},
    {"input": "x", "temperature": 3},
    {"input": "x", "previous_response_id": "../etc"},
    {"input": "x", "metadata": {str(i): "v" for i in range(17)}},
    {"input": "x", "unknown": 1},
    {"input": [{"role": "robot", "content": "x"}]},
])
def test_every_client_value_is_bounded(kw: dict) -> None:
    with pytest.raises(ValidationError):
        request(**kw)


def _events(frames: list[bytes]) -> list[dict]:
    return [json.loads(f.split(b"\ndata: ", 1)[1]) for f in frames]


def test_text_then_a_tool_call_make_two_items_in_the_apis_event_order() -> None:
    asm = Assembler(streaming=True)
    asm.feed(Delta(text="Let me "))
    asm.feed(Delta(text="check.", chat_extra={}))
    asm.feed(Delta(chat_extra={"tool_calls": [{"index": 0, "id": "call_9", "type": "function",
                                               "function": {"name": "get_weather", "arguments": ""}}]}))
    asm.feed(Delta(chat_extra={"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}))
    asm.feed(Delta(chat_extra={"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
                   finish_reason="tool_calls", prompt_tokens=10, completion_tokens=7))
    asm.finish()
    events = _events(asm.take())
    assert [e["type"] for e in events] == [
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["item"]["content"] == [] and events[0]["item"]["status"] == "in_progress"  # as it was then
    message, call = asm.output
    assert message["content"][0]["text"] == "Let me check." and message["status"] == "completed"
    assert (call["call_id"], call["name"], json.loads(call["arguments"])) == ("call_9", "get_weather",
                                                                              {"city": "Paris"})
    assert assistant_turn(asm.text, asm.calls)["tool_calls"][0]["function"]["arguments"] == call["arguments"]


def test_without_a_stream_no_events_are_made() -> None:
    asm = Assembler(streaming=False)
    asm.feed(Delta(text="x", finish_reason="length", completion_tokens=1))
    asm.finish()
    assert asm.take() == [] and asm.output[0]["content"][0]["text"] == "x" and asm.final is not None
