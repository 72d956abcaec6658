"""A Responses request as the one internal conversation the LLM layer serves: a chat request.

The conversation a `previous_response_id` names is expanded here, from the gateway's own store,
before anything is rendered or routed, so no worker needs a store and the router sees the whole
prefix. Items map onto chat messages: messages keep their role (`developer` as `system`), a run of
`function_call` items becomes one assistant message's `tool_calls` (joined to the assistant text
before it), and each `function_call_output` a `tool` message. `instructions` lead as a system
message and, as OpenAI does, are not carried over to the next response.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from engines.errors import ErrorKind, SluiceError
from gateway.openai.responses.schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    OtherItem,
    Part,
    ResponsesRequest,
)
from gateway.openai.schemas import ChatCompletionRequest

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _unsupported(what: str, param: str) -> SluiceError:
    return SluiceError(f"{what} is not supported by this server", ErrorKind.UNSUPPORTED, param=param)


def _text(content: str | list[Part], where: str) -> str:
    if isinstance(content, str):
        return content
    out = []
    for k, part in enumerate(content):
        if part.type not in _TEXT_PARTS:
            raise _unsupported(f"content of type '{part.type}'", f"{where}.{k}")
        out.append(part.text if part.text is not None else part.refusal or "")
    return "".join(out)


def input_items(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as items with ids, as `GET /v1/responses/{id}/input_items` lists them."""
    raw: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": body.input}] if isinstance(
        body.input, str) else [
        item.model_dump(exclude_none=True, by_alias=True) for item in body.input]
    out = []
    for item in raw:
        item.setdefault("type", "message")
        content = item.get("content")
        if item["type"] == "message" and isinstance(content, str):
            item["content"] = [{"type": "input_text", "text": content}]
        item.setdefault("id", new_id({"message": "msg", "function_call": "fc"}.get(item["type"], "item")))
        out.append(item)
    return out


def to_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input items as chat messages (no instructions)."""
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(body.input):
        where = f"input.{i}"
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            out.append({"role": role, "content": _text(item.content, f"{where}.content")})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name,
                                                                        "arguments": item.arguments}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, f"{where}.output")})
        elif isinstance(item, OtherItem):
            raise _unsupported(f"input items of type '{item.type}'", f"{where}.type")
    return out


def refuse_unsupported(body: ResponsesRequest) -> None:
    for name, what in (("background", "background responses"), ("conversation", "server-side conversations"),
                       ("prompt", "stored prompts"), ("top_logprobs", "top_logprobs")):
        value = getattr(body, name)
        if value not in (None, False, 0):
            raise _unsupported(what, name)
    if body.reasoning and body.reasoning.get("effort") not in (None, "none", "minimal"):
        raise _unsupported("reasoning effort", "reasoning")
    for i, tool in enumerate(body.tools or ()):
        if tool.type != "function":
            raise _unsupported(f"tools of type '{tool.type}' (only function tools are)", f"tools.{i}.type")
        if not tool.name:
            raise SluiceError("a function tool needs a name", ErrorKind.INVALID_ARG, param=f"tools.{i}.name")


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise SluiceError("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
                      ErrorKind.INVALID_ARG, param="tool_choice")


def _response_format(body: ResponsesRequest) -> dict[str, Any] | None:
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise SluiceError("a json_schema format needs a schema", ErrorKind.INVALID_ARG, param="text.format.schema")
    return {"type": "json_schema", "json_schema": {"name": fmt.name or "output", "schema": fmt.schema_,
                                                   "strict": fmt.strict}}


def to_chat(body: ResponsesRequest, history: list[dict[str, Any]]
            ) -> tuple[ChatCompletionRequest, list[dict[str, Any]]]:
    """The chat request this Responses request stands for, and the conversation it continues
    (history + its own input, without instructions), to be stored with its output."""
    refuse_unsupported(body)
    conversation = [*history, *to_messages(body)]
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + conversation
    if not any(m["role"] != "system" for m in messages):
        raise SluiceError("input must hold at least one message", ErrorKind.INVALID_ARG, param="input")
    chat: dict[str, Any] = {
        "model": body.model, "messages": messages, "stream": body.stream, "max_tokens": body.max_output_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "tool_choice": _tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls, "response_format": _response_format(body),
        "user": body.user or body.safety_identifier, **body.vllm_extras()}
    if body.tools:
        chat["tools"] = [{"type": "function", "function": {
            "name": t.name, "description": t.description or "", "parameters": t.parameters or {"type": "object"}}}
            for t in body.tools]
    return ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None}), conversation


def assistant_turn(text: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The answer as the next request's history will render it."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [{"id": c["call_id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
    return message


def arguments_json(arguments: str) -> str:
    """Arguments as the model wrote them (a client parses them); '{}' for none."""
    return arguments if arguments.strip() else json.dumps({})
