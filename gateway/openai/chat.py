"""POST /v1/chat/completions: validate, render, hand to the LLM layer, build the response.

Chat responses from a dispatch's deltas: `chat.completion.chunk` events, or one `chat.completion`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engines.base import Delta
from engines.errors import ErrorKind, SluiceError
from gateway.app_state import asks_from, hints_from, state_of
from gateway.json_body import OffLoopJSONRoute
from gateway.llm.dispatch import Dispatch
from gateway.llm.service import GenerateCall, Prompt
from gateway.llm.targets import RouteHints
from gateway.openai.logprobs import chat_logprobs
from gateway.openai.prompts import render_chat
from gateway.openai.schemas import (
    FORWARDED_CHAT_FIELDS,
    RENDERED_MESSAGE_FIELDS,
    ChatCompletionRequest,
    generation_params,
    refuse_unsupported,
)
from gateway.openai.streaming import ChunkEncoder, UsageTally, new_id, sse, unless_disconnected
from gateway.security.access import key_id_of

router = APIRouter(route_class=OffLoopJSONRoute)  # large bodies are decoded off the event loop


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    request.state.sluice_model = body.model
    st = state_of(request)
    refuse_unsupported(body)
    d = await dispatch_chat(request, body, new_id("chatcmpl"), hints_from(request),
                            text_json=bool(body.stream and st.settings.relay_splice and not body.logprobs))
    if body.stream:
        return sse(stream_chunks(d, body), ping_s=st.settings.sse_ping_s, headers=d.headers(),
                   on_close=d.close)
    try:
        result = await unless_disconnected(request, collect(d))
        return JSONResponse(result, headers=d.headers())
    finally:
        d.close()


async def dispatch_chat(request: Request, body: ChatCompletionRequest, request_id: str, hints: RouteHints, *,
                        text_json: bool = False) -> Dispatch:
    """Render a chat request with the model's own template and dispatch it: the one step chat, the
    Responses API and the Messages API (which convert their bodies to a chat request) share."""
    st = state_of(request)
    model = st.llm.get(body.model)
    ids = await render_chat(st.renderer, model, body.messages, body)
    return await st.llm.dispatch(GenerateCall(
        model, [Prompt(ids)], generation_params(body), request_id, kind="chat", chat_body=forwarded(body, model.name),
        cache_salt=body.cache_salt, hints=hints, key_id=key_id_of(request), text_json=text_json,
        asks=asks_from(request)))


def forwarded(body: ChatCompletionRequest, model: str) -> dict[str, Any]:
    """What a remote worker's own chat endpoint gets of the client's body: the fields the gateway
    rendered the prompt from (messages with only their rendered fields) and those the worker's tool
    parsers need. The validated sampling parameters are laid over it per choice."""
    out = body.model_dump(include=set(FORWARDED_CHAT_FIELDS), exclude_unset=True, exclude_none=True)
    out["messages"] = [m.model_dump(include=set(RENDERED_MESSAGE_FIELDS), exclude_unset=True, exclude_none=True)
                       for m in body.messages]
    out["model"] = model
    return out


def finish_reason(reason: str | None) -> str | None:
    # "abort" never reaches a client that is still connected; map defensively.
    return "stop" if reason == "abort" else reason


def raise_if_failed(delta: Delta) -> None:
    if delta.finish_reason == "error":
        raise SluiceError(delta.error or "the engine failed while generating", ErrorKind.INTERNAL)


async def stream_chunks(d: Dispatch, body: ChatCompletionRequest) -> AsyncGenerator[bytes, None]:
    """The chunks of a streamed chat completion, as JSON bytes."""
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    enc = ChunkEncoder(d.request_id, "chat.completion.chunk", d.created, d.model.name, include_usage=include_usage)
    tally = UsageTally([len(d.requests[0].prompt_token_ids)])
    started: set[int] = set()
    async with aclosing(d.deltas()) as deltas:
        async for i, delta in deltas:
            tally.add(i, 0, delta)
            if i not in started:  # the role appears only in each choice's first delta
                started.add(i)
                yield enc.choices([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}])
            raise_if_failed(delta)
            if delta.text_json is not None:  # plain text the worker's events carried as JSON
                if delta.text_json:
                    yield enc.content_json(i, delta.text_json)
                continue
            if delta.text and not (delta.chat_extra or delta.finish_reason or delta.logprobs):
                yield enc.content(i, delta.text)  # the common chunk, from the template
                continue
            out: dict[str, Any] = {}
            if delta.text:
                out["content"] = delta.text
            if delta.chat_extra:
                out.update(delta.chat_extra)
            if out or delta.finish_reason or delta.logprobs:
                yield enc.choices([{"index": i, "delta": out, "logprobs": chat_logprobs(delta.logprobs),
                                    "finish_reason": finish_reason(delta.finish_reason)}])
    if include_usage:
        yield enc.usage(tally.body())


async def collect(d: Dispatch) -> dict[str, Any]:
    n = len(d.requests)
    tally = UsageTally([len(d.requests[0].prompt_token_ids)])
    texts: dict[int, list[str]] = {i: [] for i in range(n)}
    extras: dict[int, dict[str, Any]] = {i: {} for i in range(n)}
    logprobs: dict[int, list[dict[str, Any]]] = {i: [] for i in range(n)}
    finish: dict[int, str | None] = {}
    async with aclosing(d.deltas()) as deltas:
        async for i, delta in deltas:
            tally.add(i, 0, delta)
            raise_if_failed(delta)
            texts[i].append(delta.text)
            if delta.chat_extra:
                merge_extra(extras[i], delta.chat_extra)
            logprobs[i].extend(delta.logprobs or ())
            if delta.finish_reason:
                finish[i] = finish_reason(delta.finish_reason)
    choices = []
    for i in range(n):
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts[i]), **extras[i]}
        if message.get("tool_calls") and not message["content"]:
            message["content"] = None
        choices.append({"index": i, "message": message, "logprobs": chat_logprobs(logprobs[i]),
                        "finish_reason": finish.get(i)})
    return {"id": d.request_id, "object": "chat.completion", "created": d.created, "model": d.model.name,
            "system_fingerprint": None, "choices": choices, "usage": tally.body()}


def merge_extra(acc: dict[str, Any], extra: dict[str, Any]) -> None:
    """Fold streamed chat extras (reasoning text, tool-call fragments) into a message."""
    for key, value in extra.items():
        if key == "tool_calls" and isinstance(value, list):
            _merge_tool_calls(acc.setdefault("tool_calls", []), value)
        elif isinstance(value, str):
            acc[key] = acc.get(key, "") + value
        else:
            acc[key] = value


def _merge_tool_calls(calls: list[dict[str, Any]], fragments: list[Any]) -> None:
    for frag in fragments:
        if not isinstance(frag, dict):
            continue
        idx = frag.get("index", len(calls))
        if not isinstance(idx, int) or not 0 <= idx <= len(calls):
            idx = len(calls)  # a worker's bad index must not grow the list without bound
        if idx == len(calls):
            calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        call = calls[idx]
        call["id"] = frag.get("id") or call["id"]
        call["type"] = frag.get("type") or call["type"]
        fn = frag.get("function") or {}
        call["function"]["name"] += fn.get("name") or ""
        call["function"]["arguments"] += fn.get("arguments") or ""
