"""A Messages request as the one internal conversation the LLM layer serves: an OpenAI chat request.

Chat, Responses and Messages share one pipeline (render with the model's own template, route by
the exact tokens, dispatch, and a remote worker's own chat endpoint with its tool and reasoning
parsers); each API only converts at its edge. Here:

- `system` becomes the first message; text blocks become content parts;
- an assistant's `tool_use` blocks become `tool_calls` (arguments as JSON), and a user's
  `tool_result` blocks become `tool` messages, ahead of the user's text, as the template expects;
- `tools` become function tools, `tool_choice` auto/any/tool/none becomes auto/required/named/none;
- `stop_sequences` are asked of the engine with the stop string kept in the output, so the edge
  can say which one matched (`stop_sequence`) and cut it (`StopMatcher`).
"""

from __future__ import annotations

import json
from typing import Any

from engines.errors import ErrorKind, SluiceError
from gateway.anthropic.schemas import (
    Conversation,
    MessagesRequest,
    OtherBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.openai.schemas import ChatCompletionRequest

FINISH_TO_STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "abort": "end_turn"}


def _unsupported(kind: str, where: str) -> SluiceError:
    return SluiceError(f"content blocks of type '{kind}' are not supported by this server (text models only)",
                       ErrorKind.UNSUPPORTED, param=where)


def _text_of_result(block: ToolResultBlock, where: str) -> str:
    if block.content is None or isinstance(block.content, str):
        return block.content or ""
    parts = []
    for k, part in enumerate(block.content):
        if isinstance(part, OtherBlock):
            raise _unsupported(part.type, f"{where}.content.{k}")
        parts.append(part.text)
    return "\n".join(parts)


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolResultBlock):
            content = _text_of_result(block, f"{where}.content.{j}")
            out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                        "content": f"Error: {content}" if block.is_error else content})
        elif isinstance(block, ToolUseBlock):
            raise SluiceError("tool_use blocks belong in assistant messages", ErrorKind.INVALID_ARG,
                              param=f"{where}.content.{j}")
        elif not isinstance(block, ThinkingBlock):
            raise _unsupported(block.type, f"{where}.content.{j}")
    if texts:
        out.append({"role": "user", "content": texts})
    return out


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolUseBlock):
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": json.dumps(block.input)}})
        elif isinstance(block, ToolResultBlock):
            raise SluiceError("tool_result blocks belong in user messages", ErrorKind.INVALID_ARG,
                              param=f"{where}.content.{j}")
        elif not isinstance(block, ThinkingBlock):  # earlier reasoning: accepted, not rendered
            raise _unsupported(block.type, f"{where}.content.{j}")
    message: dict[str, Any] = {"role": "assistant", "content": texts or ""}
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(body: Conversation) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if body.system:
        system = body.system if isinstance(body.system, str) else "\n\n".join(b.text for b in body.system)
        out.append({"role": "system", "content": system})
    for i, m in enumerate(body.messages):
        where = f"messages.{i}"
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "user":
            out.extend(_user(m.content, where))
        else:
            out.append(_assistant(m.content, where))
    if not out or all(m["role"] == "system" for m in out):
        raise SluiceError("messages must hold at least one user or assistant message with content",
                          ErrorKind.INVALID_ARG, param="messages")
    return out


def _tools(body: Conversation) -> dict[str, Any]:
    if body.thinking is not None and body.thinking.get("type") != "disabled":
        raise SluiceError("extended thinking is not supported by this server", ErrorKind.UNSUPPORTED,
                          param="thinking")
    if body.container is not None:
        raise SluiceError("code-execution containers are not supported by this server", ErrorKind.UNSUPPORTED,
                          param="container")
    out: dict[str, Any] = {}
    fmt = body.output_config.format if body.output_config is not None else None
    if fmt is not None:
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema_}}
    if body.tools:
        for i, tool in enumerate(body.tools):
            if tool.type not in (None, "custom"):
                raise SluiceError(f"server tools ('{tool.type}') are not supported by this server",
                                  ErrorKind.UNSUPPORTED, param=f"tools.{i}.type")
        out["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                          "parameters": t.input_schema}} for t in body.tools]
    choice = body.tool_choice
    if choice is not None:
        if choice.type == "tool":
            if not choice.name:
                raise SluiceError("tool_choice of type 'tool' needs a name", ErrorKind.INVALID_ARG,
                                  param="tool_choice.name")
            out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
        if choice.disable_parallel_tool_use:
            out["parallel_tool_calls"] = False
    return out


def to_chat(body: Conversation, *, stream: bool = False) -> ChatCompletionRequest:
    """The chat request a Messages (or count_tokens) body stands for."""
    chat: dict[str, Any] = {"model": body.model, "messages": chat_messages(body), **_tools(body)}
    if isinstance(body, MessagesRequest):
        chat.update({"max_tokens": body.max_tokens, "stream": stream, "temperature": body.temperature,
                     "top_p": body.top_p, **body.vllm_extras()})
        if body.stop_sequences:
            chat.update({"stop": body.stop_sequences, "include_stop_str_in_output": True})
        if body.metadata is not None and body.metadata.user_id:
            chat["user"] = body.metadata.user_id
    return ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})


class StopMatcher:
    """Holds back the tail of a streamed answer that could still turn out to be a stop sequence
    (the engine returns the stop string, as asked), so a client never sees it; at the end, says
    which stop sequence ended the answer."""

    def __init__(self, stops: list[str] | None) -> None:
        self.stops = sorted(stops or [], key=len, reverse=True)
        self.hold = max((len(s) for s in self.stops), default=0)
        self.pending = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        if not self.hold:
            return text
        self.pending += text
        cut = len(self.pending) - self.hold
        if cut <= 0:
            return ""
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def finish(self, finish_reason: str | None) -> str:
        """The rest of the text, without the stop sequence that ended it."""
        rest, self.pending = self.pending, ""
        if finish_reason == "stop":
            for s in self.stops:
                if rest.endswith(s):
                    self.matched = s
                    return rest[: -len(s)]
        return rest

    def stop_reason(self, finish_reason: str | None, tool_use: bool = False) -> str:
        """Anthropic's reason: a tool call ends the turn as `tool_use` however the engine finished
        (vLLM reports a named tool choice as `stop`)."""
        if self.matched is not None:
            return "stop_sequence"
        if tool_use and finish_reason != "length":
            return "tool_use"
        return FINISH_TO_STOP_REASON.get(finish_reason or "stop", "end_turn")
