"""Responses API output from a dispatch's deltas: output items, the response object, and the
streamed events in the API's order, each with its `sequence_number`.

One `Assembler` serves both modes: fed each delta, it keeps the output items (a `message` with one
`output_text` part, `function_call` items from the worker's parsed tool calls, a `reasoning` item
from reasoning text) and returns the events that delta makes:
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`, the
function-call argument deltas, their `...done` events and `response.output_item.done`. The route
wraps them in `response.created` / `response.in_progress` and `response.completed`,
`response.incomplete` (max_output_tokens) or `response.failed`.
"""

from __future__ import annotations

from typing import Any

from engines.base import Delta
from gateway.openai.responses.convert import new_id
from gateway.sse import dumps


def frame(event: dict[str, Any]) -> bytes:
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + dumps(event) + b"\n\n"


class Assembler:
    """`streaming`: events are framed as they are made (so a later change to an item never alters an
    event already made); otherwise none are made."""

    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self.pending: list[bytes] = []
        self.output: list[dict[str, Any]] = []
        self.seq = 0
        self.text_parts: list[str] = []
        self.calls: list[dict[str, Any]] = []  # function_call items, in order
        self._open: dict[str, Any] | None = None  # the item receiving deltas
        self._call_by_index: dict[int, dict[str, Any]] = {}
        self.final: Delta | None = None

    def event(self, kind: str, **fields: Any) -> None:
        if self.streaming:
            self.pending.append(frame({"type": kind, "sequence_number": self.seq, **fields}))
            self.seq += 1

    def take(self) -> list[bytes]:
        out, self.pending = self.pending, []
        return out

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def feed(self, delta: Delta) -> None:
        extra = delta.chat_extra or {}
        reasoning = extra.get("reasoning_content") or extra.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self._reasoning(reasoning)
        for frag in extra.get("tool_calls") or ():
            if isinstance(frag, dict):
                self._call(frag)
        if delta.text:
            self._text(delta.text)
        if delta.finish_reason:
            self.final = delta

    def finish(self) -> None:
        self._close()

    def _start(self, item: dict[str, Any]) -> None:
        self._close()
        self.output.append(item)
        self._open = item
        self.event("response.output_item.added", output_index=len(self.output) - 1, item=item)

    def _close(self) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        index = len(self.output) - 1
        if item["type"] == "message":
            part = item["content"][0]
            self.event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                       text=part["text"], logprobs=[])
            self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                       part=part)
        elif item["type"] == "function_call":
            self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                       name=item["name"], arguments=item["arguments"])
        elif item["type"] == "reasoning":
            self.event("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                       text=item["content"][0]["text"])
        item["status"] = "completed"
        self.event("response.output_item.done", output_index=index, item=item)

    def _text(self, text: str) -> None:
        item = self._open
        if item is None or item["type"] != "message":
            item = {"id": new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                    "content": []}
            self._start(item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self.event("response.content_part.added", item_id=item["id"], output_index=len(self.output) - 1,
                       content_index=0, part=part)
            item["content"].append(part)
        item["content"][0]["text"] += text
        self.text_parts.append(text)
        self.event("response.output_text.delta", item_id=item["id"], output_index=len(self.output) - 1,
                   content_index=0, delta=text, logprobs=[])

    def _call(self, frag: dict[str, Any]) -> None:
        index = frag.get("index", 0) if isinstance(frag.get("index", 0), int) else 0
        fn = frag.get("function") or {}
        call = self._call_by_index.get(index)
        if call is None:
            call = {"id": new_id("fc"), "type": "function_call", "status": "in_progress",
                    "call_id": frag.get("id") or new_id("call"), "name": fn.get("name") or "", "arguments": ""}
            self._call_by_index[index] = call
            self.calls.append(call)
            self._start(call)
        elif call is not self._open:
            return  # a fragment of a call already closed: nowhere to put it
        if fn.get("arguments"):
            call["arguments"] += fn["arguments"]
            self.event("response.function_call_arguments.delta", item_id=call["id"],
                       output_index=len(self.output) - 1, delta=fn["arguments"])

    def _reasoning(self, text: str) -> None:
        item = self._open
        if item is None or item["type"] != "reasoning":
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}]}
            self._start(item)
        item["content"][0]["text"] += text
        self.event("response.reasoning_text.delta", item_id=item["id"], output_index=len(self.output) - 1,
                   content_index=0, delta=text)


def usage(final: Delta | None, prompt: int) -> dict[str, Any]:
    prompt_tokens = final.prompt_tokens if final is not None and final.prompt_tokens is not None else prompt
    output = final.completion_tokens if final is not None else 0
    cached = (final.cached_tokens if final is not None else None) or 0
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output}
