"""POST /v1/completions: text, list of texts, token ids or lists of token ids."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engines.base import EngineRequest
from gateway.errors import OpenAIError
from gateway.llm_service import LLMModel
from gateway.openai.schemas import CompletionRequest
from gateway.openai.streaming import Dispatch, UsageTally, dispatch, new_id, sse, unless_disconnected
from gateway.state import hints_from, state_of

router = APIRouter()


def _prompts(model: LLMModel, prompt: Any) -> list[tuple[list[int], str | None]]:
    """Normalise the four prompt forms into (token ids, original text or None)."""
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif prompt and all(isinstance(t, int) for t in prompt):
        items = [prompt]
    else:
        items = list(prompt)
    out: list[tuple[list[int], str | None]] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            ids = model.tokenizer.encode(item)
            if not ids:
                raise OpenAIError(400, f"prompt {i} is empty after tokenization", param="prompt")
            out.append((ids, item))
        else:
            bad = [t for t in item if not 0 <= t < model.tokenizer.vocab_size]
            if bad:
                raise OpenAIError(400, f"prompt {i}: token id {bad[0]} is outside the vocabulary "
                                  f"[0, {model.tokenizer.vocab_size})", param="prompt")
            out.append((list(item), None))
    return out


def prepare(request: Request, body: CompletionRequest) -> tuple[Dispatch, list[tuple[list[int], str | None]]]:
    svc = state_of(request).llm
    model = svc.get(body.model)
    if body.best_of is not None and body.best_of != body.n:
        raise OpenAIError(400, "best_of different from n is not supported", param="best_of")
    if body.suffix:
        raise OpenAIError(400, "suffix is not supported by this model", param="suffix")
    prompts = _prompts(model, body.prompt)
    rid = new_id("cmpl")
    reqs = []
    for p, (ids, text) in enumerate(prompts):
        for i in range(body.n):
            sampling = svc.sampling(model, body, len(ids), seed_offset=i)
            reqs.append(EngineRequest(f"{rid}-{p}-{i}", model.name, ids, sampling, kind="completion",
                                      prompt_text=text, cache_salt=body.cache_salt))
    return dispatch(svc, model, reqs, hints_from(request), rid), prompts


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    request.state.sluice_model = body.model
    d, prompts = prepare(request, body)
    headers = d.headers(request.headers.get("x-request-id"))
    if body.stream:
        return sse(stream_chunks(d, body, prompts), ping_s=state_of(request).settings.sse_ping_s,
                   headers=headers, on_close=d.close)
    try:
        result = await unless_disconnected(request, collect(d, body, prompts))
        return JSONResponse(result, headers=d.headers(request.headers.get("x-request-id")))
    finally:
        d.close()


def _echo_text(d: Dispatch, prompt: tuple[list[int], str | None]) -> str:
    ids, text = prompt
    return text if text is not None else d.model.tokenizer.decode(ids, skip_special_tokens=False)


def _chunk(d: Dispatch, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": d.request_id, "object": "text_completion", "created": d.created, "model": d.model.name,
            "system_fingerprint": None, "choices": choices, **extra}


async def stream_chunks(d: Dispatch, body: CompletionRequest, prompts: list[tuple[list[int], str | None]]
                        ) -> AsyncIterator[dict[str, Any]]:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    extra = {"usage": None} if include_usage else {}
    tally = UsageTally([len(ids) for ids, _ in prompts])
    echoed: set[int] = set()
    async with aclosing(d.deltas()) as deltas:
        async for i, delta in deltas:
            tally.add(i, i // body.n, delta)
            if delta.finish_reason == "error":
                raise OpenAIError(500, delta.error or "the engine failed while generating",
                                  err_type="server_error")
            text = delta.text
            if body.echo and i not in echoed:
                echoed.add(i)
                text = _echo_text(d, prompts[i // body.n]) + text
            if text or delta.finish_reason or delta.logprobs:
                reason = "stop" if delta.finish_reason == "abort" else delta.finish_reason
                yield _chunk(d, [{"index": i, "text": text, "logprobs": delta.logprobs,
                                  "finish_reason": reason}], **extra)
    if include_usage:
        yield _chunk(d, [], usage=tally.body())


async def collect(d: Dispatch, body: CompletionRequest, prompts: list[tuple[list[int], str | None]]
                  ) -> dict[str, Any]:
    tally = UsageTally([len(ids) for ids, _ in prompts])
    texts: dict[int, list[str]] = {i: [] for i in range(len(d.requests))}
    logprobs: dict[int, dict[str, list[Any]]] = {}
    finish: dict[int, str | None] = {}
    async with aclosing(d.deltas()) as deltas:
        async for i, delta in deltas:
            tally.add(i, i // body.n, delta)
            if delta.finish_reason == "error":
                raise OpenAIError(500, delta.error or "the engine failed while generating",
                                  err_type="server_error")
            texts[i].append(delta.text)
            if delta.logprobs:
                acc = logprobs.setdefault(i, {})
                for key, values in delta.logprobs.items():
                    acc.setdefault(key, []).extend(values or [])
            if delta.finish_reason:
                finish[i] = "stop" if delta.finish_reason == "abort" else delta.finish_reason
    choices = []
    for i in range(len(d.requests)):
        text = "".join(texts[i])
        if body.echo:
            text = _echo_text(d, prompts[i // body.n]) + text
        choices.append({"index": i, "text": text, "logprobs": logprobs.get(i), "finish_reason": finish.get(i)})
    return {"id": d.request_id, "object": "text_completion", "created": d.created, "model": d.model.name,
            "system_fingerprint": None, "choices": choices, "usage": tally.body()}
