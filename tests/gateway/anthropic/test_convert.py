"""The Messages API's conversion onto the one internal conversation (pure: no server)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from engines.errors import ErrorKind, SluiceError
from gateway.anthropic import errors
from gateway.anthropic.convert import StopMatcher, to_chat
from gateway.anthropic.schemas import MAX_MESSAGES, CountTokensRequest, MessagesRequest

TOOL = {"name": "get_weather", "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def request(**kw: object) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 8, **kw})


def test_a_tool_round_trip_becomes_chat_messages_in_template_order() -> None:
    chat = to_chat(request(system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
                           tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"}, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                                     {"type": "text", "text": "And tomorrow?"}]}]))
    msgs = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "user"]
    assert msgs[0]["content"] == "Be brief.\n\nUse tools."
    call = msgs[2]["tool_calls"][0]
    assert call["id"] == "toolu_1" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert msgs[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"}
    assert chat.tools == [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                            "parameters": TOOL["input_schema"]}}]
    assert chat.tool_choice == {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(("choice", "expected"), [({"type": "auto"}, "auto"), ({"type": "any"}, "required"),
                                                  ({"type": "none"}, "none")])
def test_tool_choice_maps_onto_chats(choice: dict, expected: str) -> None:
    assert to_chat(request(messages=[{"role": "user", "content": "hi"}], tools=[TOOL],
                           tool_choice=choice)).tool_choice == expected


def test_sampling_and_stops_carry_over() -> None:
    chat = to_chat(request(messages=[{"role": "user", "content": "hi"}], temperature=0.5, top_p=0.9, top_k=5,
                           stop_sequences=["END"], metadata={"user_id": "u1"}), stream=True)
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.top_k, chat.stream) == (8, 0.5, 0.9, 5, True)
    assert chat.stop == ["END"] and chat.include_stop_str_in_output and chat.user == "u1"


@pytest.mark.parametrize(("content", "param"), [
    ([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}],
     "messages.0.content.0"),
    ([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}],
     "messages.0.content.0.content.0"),
    ([{"type": "tool_use", "id": "t", "name": "x", "input": {}}], "messages.0.content.0"),
])
def test_what_a_text_model_cannot_take_is_refused_by_name(content: list, param: str) -> None:
    with pytest.raises(SluiceError) as e:
        to_chat(request(messages=[{"role": "user", "content": content}]))
    assert e.value.param == param and e.value.kind in (ErrorKind.UNSUPPORTED, ErrorKind.INVALID_ARG)


def test_thinking_and_server_tools_are_refused() -> None:
    with pytest.raises(SluiceError, match="thinking"):
        to_chat(request(messages=[{"role": "user", "content": "hi"}],
                        thinking={"type": "enabled", "budget_tokens": 1024}))
    with pytest.raises(SluiceError, match="server tools"):
        to_chat(request(messages=[{"role": "user", "content": "hi"}],
                        tools=[{"name": "web_search", "type": "web_search_20250305"}]))


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "hi"}]},  # no max_tokens
    {"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]},
    {"max_tokens": 4, "messages": []},
    {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1)},
    {"max_tokens": 4, "messages": [{"role": "system", "content": "hi"}]},
    {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "temperature": 1.5},
    {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "stop_sequences": ["x"] * 33},
    {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "bad name!"}]},
    {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "unknown_field": 1},
])
def test_every_client_value_is_bounded(body: dict) -> None:
    with pytest.raises(ValidationError):
        MessagesRequest.model_validate({"model": "m", **body})


def test_count_tokens_takes_no_sampling_fields() -> None:
    with pytest.raises(ValidationError):
        CountTokensRequest.model_validate({"model": "m", "max_tokens": 4, "messages": [{"role": "user",
                                                                                       "content": "hi"}]})


def test_a_stop_sequence_split_across_deltas_never_reaches_the_client() -> None:
    m = StopMatcher(["STOP", "XY"])
    out = "".join(m.feed(t) for t in ["Hello wor", "ld S", "TO", "P"])
    out += m.finish("stop")
    assert out == "Hello world " and m.matched == "STOP" and m.stop_reason("stop") == "stop_sequence"


def test_without_a_matched_stop_the_text_is_whole() -> None:
    m = StopMatcher(["STOP"])
    out = "".join(m.feed(t) for t in ["a", "bc", "STO"]) + m.finish("length")
    assert out == "abcSTO" and m.matched is None and m.stop_reason("length") == "max_tokens"
    assert StopMatcher(None).feed("x") == "x"
    assert StopMatcher([]).stop_reason("stop", tool_use=True) == "tool_use"


@pytest.mark.parametrize(("kind", "status", "err_type"), [
    (ErrorKind.OVERLOADED, 529, "overloaded_error"), (ErrorKind.NOT_FOUND, 404, "not_found_error"),
    (ErrorKind.UNAUTHENTICATED, 401, "authentication_error"), (ErrorKind.RATE_LIMITED, 429, "rate_limit_error"),
    (ErrorKind.INVALID_ARG, 400, "invalid_request_error"), (ErrorKind.INTERNAL, 500, "api_error")])
def test_errors_take_anthropics_shape(kind: ErrorKind, status: int, err_type: str) -> None:
    got_status, body, headers = errors.of(SluiceError("why", kind))
    assert got_status == status and body == {"type": "error", "error": {"type": err_type, "message": "why"}}
    assert ("Retry-After" in headers) == (status in (429, 529))
