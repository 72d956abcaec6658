"""POST /v1/chat/completions."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engines.base import EngineRequest
from gateway.errors import OpenAIError
from gateway.llm_service import LLMModel
from gateway.openai.schemas import ChatCompletionRequest, ChatMessage
from gateway.openai.streaming import Dispatch, UsageTally, dispatch, new_id, sse, unless_disconnected
from gateway.state import hints_from, state_of

router = APIRouter()


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """OpenAI messages → the dicts a chat template expects.

    `developer` is treated as `system`; content parts are joined; unknown keys
    inside parts are ignored; non-text parts are refused (text-only models)."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise OpenAIError(400, f"messages[{i}]: content part type {part.type!r} is not supported "
                                      "by this model (text only)", param=f"messages.{i}.content")
                texts.append(part.text)
            content = "\n".join(texts)
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
        for key in ("name", "tool_calls", "tool_call_id"):
            value = getattr(m, key)
            if value is not None:
                msg[key] = value
        out.append(msg)
    return out


def prepare(request: Request, body: ChatCompletionRequest) -> Dispatch:
    st = state_of(request)
    svc = st.llm
    model = svc.get(body.model)
    try:
        ids = model.tokenizer.render_chat(
            template_messages(body.messages),
            tools=body.tools,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            template_kwargs=body.chat_template_kwargs,
        )
    except OpenAIError:
        raise
    except Exception as e:  # template errors are the caller's (bad roles, bad tool schema)
        raise OpenAIError(400, f"could not apply the chat template: {e}", param="messages") from None
    rid = new_id("chatcmpl")
    reqs = []
    for i in range(body.n):
        sampling = svc.sampling(model, body, len(ids), seed_offset=i)
        fwd = body.model_dump(exclude_unset=True, exclude_none=True)
        fwd.update(n=1, model=model.name)
        if sampling.seed is not None:
            fwd["seed"] = sampling.seed
        fwd.pop("stream_options", None)
        reqs.append(EngineRequest(f"{rid}-{i}", model.name, ids, sampling, kind="chat", chat_body=fwd,
                                  cache_salt=body.cache_salt))
    return dispatch(svc, model, reqs, hints_from(request), rid)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    request.state.sluice_model = body.model
    d = prepare(request, body)
    headers = d.headers(request.headers.get("x-request-id"))
    if body.stream:
        return sse(stream_chunks(d, body), ping_s=state_of(request).settings.sse_ping_s, headers=headers,
                   on_close=d.close)
    try:
        result = await unless_disconnected(request, collect(d, body))
        return JSONResponse(result, headers=d.headers(request.headers.get("x-request-id")))
    finally:
        d.close()


def _chunk(d: Dispatch, model: LLMModel, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": d.request_id, "object": "chat.completion.chunk", "created": d.created, "model": model.name,
            "system_fingerprint": None, "choices": choices, **extra}


async def stream_chunks(d: Dispatch, body: ChatCompletionRequest) -> AsyncIterator[dict[str, Any]]:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    extra = {"usage": None} if include_usage else {}
    tally = UsageTally([len(d.requests[0].prompt_token_ids)])
    started: set[int] = set()
    async with aclosing(d.deltas()) as deltas:
        async for i, delta in deltas:
            tally.add(i, 0, delta)
            if i not in started:  # the role appears only in each choice's first delta
                started.add(i)
                first = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}
                yield _chunk(d, d.model, [first], **extra)
            if delta.finish_reason == "error":
                raise OpenAIError(500, delta.error or "the engine failed while generating",
                                  err_type="server_error")
            out: dict[str, Any] = {}
            if delta.text:
                out["content"] = delta.text
            if delta.chat_extra:
                out.update(delta.chat_extra)
            if out or delta.finish_reason or delta.logprobs:
                choice = {"index": i, "delta": out, "logprobs": delta.logprobs,
                          "finish_reason": _finish(delta.finish_reason)}
                yield _chunk(d, d.model, [choice], **extra)
    if include_usage:
        yield _chunk(d, d.model, [], usage=tally.body())


def _finish(reason: str | None) -> str | None:
    # "abort" never reaches a client that is still connected; map defensively.
    return "stop" if reason == "abort" else reason


async def collect(d: Dispatch, body: ChatCompletionRequest) -> dict[str, Any]:
    tally = UsageTally([len(d.requests[0].prompt_token_ids)])
    texts: dict[int, list[str]] = {i: [] for i in range(len(d.requests))}
    extras: dict[int, dict[str, Any]] = {i: {} for i in range(len(d.requests))}
    logprobs: dict[int, list[Any]] = {i: [] for i in range(len(d.requests))}
    finish: dict[int, str | None] = {}
    async with aclosing(d.deltas()) as deltas:
        async for i, delta in deltas:
            tally.add(i, 0, delta)
            if delta.finish_reason == "error":
                raise OpenAIError(500, delta.error or "the engine failed while generating",
                                  err_type="server_error")
            texts[i].append(delta.text)
            if delta.chat_extra:
                _merge_extra(extras[i], delta.chat_extra)
            if delta.logprobs:
                logprobs[i].extend(delta.logprobs.get("content") or [])
            if delta.finish_reason:
                finish[i] = _finish(delta.finish_reason)
    choices = []
    for i in range(len(d.requests)):
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts[i])}
        message.update(extras[i])
        if message.get("tool_calls") and not message["content"]:
            message["content"] = None
        choices.append({"index": i, "message": message,
                        "logprobs": {"content": logprobs[i]} if logprobs[i] else None,
                        "finish_reason": finish.get(i)})
    return {"id": d.request_id, "object": "chat.completion", "created": d.created, "model": d.model.name,
            "system_fingerprint": None, "choices": choices, "usage": tally.body()}


def _merge_extra(acc: dict[str, Any], extra: dict[str, Any]) -> None:
    """Fold streamed chat extras (reasoning text, tool-call fragments) into a message."""
    for key, value in extra.items():
        if key == "tool_calls":
            calls = acc.setdefault("tool_calls", [])
            for frag in value:
                idx = frag.get("index", len(calls))
                while len(calls) <= idx:
                    calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                call = calls[idx]
                call["id"] = frag.get("id") or call["id"]
                call["type"] = frag.get("type") or call["type"]
                fn = frag.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                call["function"]["arguments"] += fn.get("arguments") or ""
        elif isinstance(value, str):
            acc[key] = acc.get(key, "") + value
        else:
            acc[key] = value
