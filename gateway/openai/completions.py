"""POST /v1/completions: text, list of texts, token ids or lists of token ids.

Completion responses from a dispatch's deltas: `text_completion` events, or one `text_completion`.

Choice `i` of a request with several prompts answers prompt `i // n`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engines.errors import ErrorKind, SluiceError
from gateway.app_state import asks_from, hints_from, state_of
from gateway.json_body import OffLoopJSONRoute
from gateway.llm.dispatch import Dispatch
from gateway.llm.service import GenerateCall, Prompt
from gateway.openai.chat import finish_reason, raise_if_failed
from gateway.openai.logprobs import CompletionLogprobs
from gateway.openai.prompts import prompt_count, tokenize_prompts
from gateway.openai.schemas import CompletionRequest, generation_params
from gateway.openai.streaming import ChunkEncoder, UsageTally, json_body, new_id, sse, unless_disconnected
from gateway.security.access import key_id_of

router = APIRouter(route_class=OffLoopJSONRoute)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    request.state.sluice_model = body.model
    st = state_of(request)
    model = st.llm.get(body.model)
    if body.best_of is not None and body.best_of != body.n:
        raise SluiceError("best_of different from n is not supported", ErrorKind.UNSUPPORTED, param="best_of")
    if body.suffix:
        raise SluiceError("suffix is not supported by this model", ErrorKind.UNSUPPORTED, param="suffix")
    st.llm.check_fanout(prompt_count(body.prompt), body.n)  # before tokenizing thousands of prompts
    prompts = await tokenize_prompts(st.renderer, model, body.prompt)
    call = GenerateCall(model, prompts, generation_params(body), new_id("cmpl"), cache_salt=body.cache_salt,
                        hints=hints_from(request), key_id=key_id_of(request), asks=asks_from(request),
                        text_json=bool(body.stream and st.settings.relay_splice and body.logprobs is None))
    d = await st.llm.dispatch(call)
    if body.stream:
        return sse(stream_chunks(d, body, prompts), ping_s=st.settings.sse_ping_s,
                   headers=d.headers(), on_close=d.close)
    try:
        result = await unless_disconnected(request, collect(d, body, prompts))
        return JSONResponse(result, headers=d.headers())
    finally:
        d.close()


def _echo_text(d: Dispatch, prompt: Prompt) -> str:
    if prompt.text is not None:
        return prompt.text
    return d.model.tokenizer.decode(prompt.token_ids, skip_special_tokens=False)


async def stream_chunks(d: Dispatch, body: CompletionRequest, prompts: list[Prompt]
                        ) -> AsyncGenerator[bytes, None]:
    """The chunks of a streamed completion, as JSON bytes."""
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    enc = ChunkEncoder(d.request_id, "text_completion", d.created, d.model.name, include_usage=include_usage)
    tally = UsageTally([len(p.token_ids) for p in prompts])
    offsets: dict[int, CompletionLogprobs] = {}
    async with aclosing(d.deltas()) as deltas:
        async for i, delta in deltas:
            tally.add(i, i // body.n, delta)
            raise_if_failed(delta)
            if delta.text_json is not None:  # plain text the worker's events carried as JSON
                echo = _echo_text(d, prompts[i // body.n]) if body.echo and i not in offsets else ""
                offsets.setdefault(i, CompletionLogprobs(len(echo)))
                if echo or delta.text_json:
                    yield enc.text_json(i, json_body(echo) + delta.text_json)
                continue
            text = delta.text
            if i not in offsets:
                echo = _echo_text(d, prompts[i // body.n]) if body.echo else ""
                text = echo + text
                offsets[i] = CompletionLogprobs(len(echo))
            logprobs = offsets[i].add(delta.logprobs) if delta.logprobs else None
            if not logprobs:
                offsets[i].offset += len(delta.text)
            if text and not (delta.finish_reason or logprobs):
                yield enc.text(i, text)  # the common chunk, from the template
            elif text or delta.finish_reason or logprobs:
                yield enc.choices([{"index": i, "text": text, "logprobs": logprobs,
                                    "finish_reason": finish_reason(delta.finish_reason)}])
    if include_usage:
        yield enc.usage(tally.body())


async def collect(d: Dispatch, body: CompletionRequest, prompts: list[Prompt]) -> dict[str, Any]:
    n = len(d.requests)
    tally = UsageTally([len(p.token_ids) for p in prompts])
    echoes = [_echo_text(d, prompts[i // body.n]) if body.echo else "" for i in range(n)]
    texts: dict[int, list[str]] = {i: [echoes[i]] for i in range(n)}
    logprobs = {i: CompletionLogprobs(len(echoes[i])) for i in range(n)}
    wanted: set[int] = set()
    finish: dict[int, str | None] = {}
    async with aclosing(d.deltas()) as deltas:
        async for i, delta in deltas:
            tally.add(i, i // body.n, delta)
            raise_if_failed(delta)
            texts[i].append(delta.text)
            if delta.logprobs:
                wanted.add(i)
                logprobs[i].add(delta.logprobs)
            else:
                logprobs[i].offset += len(delta.text)
            if delta.finish_reason:
                finish[i] = finish_reason(delta.finish_reason)
    choices = [{"index": i, "text": "".join(texts[i]), "logprobs": logprobs[i].body() if i in wanted else None,
                "finish_reason": finish.get(i)} for i in range(n)]
    return {"id": d.request_id, "object": "text_completion", "created": d.created, "model": d.model.name,
            "system_fingerprint": None, "choices": choices, "usage": tally.body()}
