"""Anthropic message responses from a dispatch's deltas: the event stream, or one `message`.

The stream follows the API's order: `message_start`; per content block `content_block_start`,
its deltas (`text_delta`, `input_json_delta`, `thinking_delta`) and `content_block_stop`; then
`message_delta` (stop reason, stop sequence, usage) and `message_stop`. A failure after the
first byte becomes one `error` event, and the stream ends. Blocks come from the same deltas chat
gets: text, and the chat extras a worker's parsers produced (tool-call fragments become tool_use
blocks, reasoning a thinking block).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from engines.base import Delta
from engines.errors import SluiceError
from gateway.anthropic.convert import StopMatcher
from gateway.anthropic.errors import stream_error
from gateway.llm.dispatch import Dispatch
from gateway.openai.chat import merge_extra, raise_if_failed
from gateway.sse import dumps

log = logging.getLogger("sluice.anthropic")


def frame(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + dumps(data) + b"\n\n"


def usage(prompt_tokens: int, output_tokens: int, cached: int | None) -> dict[str, Any]:
    cached = cached or 0
    return {"input_tokens": max(0, prompt_tokens - cached), "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def final_usage(final: Delta | None, prompt: int) -> dict[str, Any]:
    """Usage from the engine's final delta (prompt, output and cached tokens as it counted them)."""
    if final is None:
        return usage(prompt, 0, 0)
    return usage(final.prompt_tokens if final.prompt_tokens is not None else prompt, final.completion_tokens,
                 final.cached_tokens)


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"arguments": arguments}  # what the model wrote, when it is not JSON
    return value if isinstance(value, dict) else {"value": value}


class _Blocks:
    """Which content block is open, and the index of the next one."""

    def __init__(self) -> None:
        self.next = 0
        self.open: tuple[str, Any] | None = None  # ("text" | "thinking" | "tool", tool index)
        self.tool_block: dict[int, int] = {}

    def start(self, kind: str, key: Any, block: dict[str, Any]) -> list[bytes]:
        out = self.stop()
        self.open = (kind, key)
        if kind == "tool":
            self.tool_block[key] = self.next
        out.append(frame("content_block_start", {"type": "content_block_start", "index": self.next,
                                                 "content_block": block}))
        return out

    def stop(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        self.next += 1
        return [frame("content_block_stop", {"type": "content_block_stop", "index": self.next - 1})]

    def delta(self, delta: dict[str, Any]) -> bytes:
        return frame("content_block_delta", {"type": "content_block_delta", "index": self.next, "delta": delta})


def _text_events(blocks: _Blocks, text: str) -> list[bytes]:
    if not text:
        return []
    out = [] if blocks.open == ("text", None) else blocks.start("text", None, {"type": "text", "text": ""})
    out.append(blocks.delta({"type": "text_delta", "text": text}))
    return out


def _extra_events(blocks: _Blocks, extra: dict[str, Any]) -> list[bytes]:
    out: list[bytes] = []
    reasoning = extra.get("reasoning_content") or extra.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        if blocks.open != ("thinking", None):
            out += blocks.start("thinking", None, {"type": "thinking", "thinking": "", "signature": ""})
        out.append(blocks.delta({"type": "thinking_delta", "thinking": reasoning}))
    for frag in extra.get("tool_calls") or ():
        if not isinstance(frag, dict):
            continue
        k = frag.get("index", 0) if isinstance(frag.get("index", 0), int) else 0
        fn = frag.get("function") or {}
        if blocks.open != ("tool", k):
            if k in blocks.tool_block:  # a fragment of a block already closed: nowhere to put it
                continue
            out += blocks.start("tool", k, {"type": "tool_use", "id": frag.get("id") or f"toolu_{k}",
                                            "name": fn.get("name") or "", "input": {}})
        if fn.get("arguments"):
            out.append(blocks.delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
    return out


async def stream_events(d: Dispatch, stops: list[str] | None) -> AsyncGenerator[bytes, None]:
    prompt = len(d.requests[0].prompt_token_ids)
    blocks, matcher = _Blocks(), StopMatcher(stops)
    final: Delta | None = None
    yield frame("message_start", {"type": "message_start", "message": {
        "id": d.request_id, "type": "message", "role": "assistant", "model": d.model.name, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": usage(prompt, 0, 0)}})
    try:
        async with aclosing(d.deltas()) as deltas:
            async for _, delta in deltas:
                raise_if_failed(delta)
                if delta.chat_extra:
                    for event in _extra_events(blocks, delta.chat_extra):
                        yield event
                for event in _text_events(blocks, matcher.feed(delta.text)):
                    yield event
                if delta.finish_reason:
                    final = delta
        for event in _text_events(blocks, matcher.finish(final.finish_reason if final else None)):
            yield event
    except Exception as e:
        if not isinstance(e, SluiceError):
            log.exception("message stream failed")
        yield frame("error", stream_error(e))
        return
    for event in blocks.stop():
        yield event
    reason = matcher.stop_reason(final.finish_reason if final else None, tool_use=bool(blocks.tool_block))
    yield frame("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": reason, "stop_sequence": matcher.matched},
                                  "usage": final_usage(final, prompt)})
    yield frame("message_stop", {"type": "message_stop"})


async def collect(d: Dispatch, stops: list[str] | None) -> dict[str, Any]:
    prompt = len(d.requests[0].prompt_token_ids)
    texts: list[str] = []
    extra: dict[str, Any] = {}
    final: Delta | None = None
    async with aclosing(d.deltas()) as deltas:
        async for _, delta in deltas:
            raise_if_failed(delta)
            texts.append(delta.text)
            if delta.chat_extra:
                merge_extra(extra, delta.chat_extra)
            if delta.finish_reason:
                final = delta
    matcher = StopMatcher(stops)
    text = matcher.feed("".join(texts)) + matcher.finish(final.finish_reason if final else None)
    content: list[dict[str, Any]] = []
    reasoning = extra.get("reasoning_content") or extra.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if text:
        content.append({"type": "text", "text": text})
    for k, call in enumerate(extra.get("tool_calls") or ()):
        fn = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or f"toolu_{k}", "name": fn.get("name") or "",
                        "input": _tool_input(fn.get("arguments") or "")})
    reason = matcher.stop_reason(final.finish_reason if final else None, tool_use=bool(extra.get("tool_calls")))
    return {"id": d.request_id, "type": "message", "role": "assistant", "model": d.model.name, "content": content,
            "stop_reason": reason, "stop_sequence": matcher.matched,
            "usage": final_usage(final, prompt)}
