"""KServe generate / generate_stream for LLM models, on the same LLM pipeline as the OpenAI routes.

Body: `{"text_input": "...", "parameters": {...}}` (other top-level keys are merged
into the parameters). Response: `{"model_name", "model_version", "text_output"}`;
the stream is SSE `data: {...}` per delta, ending with an error event rather than
hanging if the engine fails. gRPC ModelInfer / ModelStreamInfer use `start` and
`text_deltas` too.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from functools import partial
from typing import Any

from engines.base import Delta
from engines.errors import ErrorKind, SluiceError, invalid
from gateway.cpu_pool import Renderer
from gateway.kserve.errors import error_body
from gateway.kserve.params import parse_params
from gateway.llm.dispatch import Dispatch
from gateway.llm.registry import LLMModel
from gateway.llm.service import GenerateCall, LLMService, Prompt
from gateway.sse import SSEResponse, relay

_BODY_KEYS = ("text_input", "prompt", "parameters", "id")


def parse_body(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(prompt text, raw parameters) of a generate body."""
    prompt = body.get("text_input", body.get("prompt"))
    if not isinstance(prompt, str):
        raise invalid("generate needs a string 'text_input'", param="text_input")
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise invalid("'parameters' must be a JSON object", param="parameters")
    extra = {k: v for k, v in body.items() if k not in _BODY_KEYS}
    return prompt, {**extra, **params}


async def start(llm: LLMService, pool: Renderer, name: str, prompt: str | bytes, raw_params: dict[str, Any],
                key_id: str | None = None) -> Dispatch:
    """Tokenize (off the event loop, within the pool's size bound), validate and dispatch one generate
    request (domain errors only); `key_id`'s token quota is charged. A gRPC `text_input` comes as UTF-8
    bytes: at least a quarter as many characters, so a larger one is refused before it is decoded."""
    model = llm.get(name)
    params = parse_params(raw_params)
    if isinstance(prompt, bytes) and len(prompt) > 4 * pool.max_prompt_chars:  # UTF-8: 1 to 4 bytes a character
        raise invalid(f"'text_input' has {len(prompt)} bytes; this server accepts at most {pool.max_prompt_chars} "
                      "characters", param="text_input")
    chars = len(prompt) if isinstance(prompt, str) else 0  # bytes: counted once decoded, off the loop
    tokenized = await pool.tokenize(partial(_tokenize, model, prompt, pool.max_prompt_chars), chars, "text_input",
                                    work=len(prompt))
    return await llm.dispatch(GenerateCall(model, [tokenized], params, f"gen-{uuid.uuid4().hex}", key_id=key_id))


def _tokenize(model: LLMModel, prompt: str | bytes, max_chars: int) -> Prompt:
    text = prompt if isinstance(prompt, str) else prompt.decode("utf-8", errors="replace")
    if len(text) > max_chars:
        raise invalid(f"'text_input' has {len(text)} characters; this server accepts at most {max_chars}",
                      param="text_input")
    ids = model.tokenizer.encode(text)
    if not ids:
        raise invalid("'text_input' is empty after tokenization", param="text_input")
    return Prompt(ids, text)


async def text_deltas(d: Dispatch) -> AsyncGenerator[Delta, None]:
    """The single choice's deltas; an engine failure becomes SluiceError(INTERNAL)."""
    async with aclosing(d.deltas()) as deltas:
        async for _, delta in deltas:
            if delta.finish_reason == "error":
                raise SluiceError(delta.error or "generation failed", ErrorKind.INTERNAL)
            yield delta


async def generate_once(llm: LLMService, pool: Renderer, name: str, version: str, body: dict[str, Any],
                        key_id: str | None = None) -> dict[str, Any]:
    d = await start(llm, pool, name, *parse_body(body), key_id=key_id)
    try:
        text = [delta.text async for delta in text_deltas(d)]
    finally:
        d.close()
    return {"model_name": name, "model_version": version or "1", "text_output": "".join(text)}


async def generate_sse(llm: LLMService, pool: Renderer, name: str, version: str, body: dict[str, Any],
                       key_id: str | None = None) -> SSEResponse:
    d = await start(llm, pool, name, *parse_body(body), key_id=key_id)
    stream = text_deltas(d)
    try:
        # Pull the first delta before answering, so an engine's refusal gets a status code.
        first = await anext(stream, None)
    except BaseException:
        d.close()
        raise

    async def events() -> AsyncGenerator[dict[str, Any], None]:
        delta = first
        try:
            while delta is not None:
                data: dict[str, Any] = {"model_name": name, "model_version": version or "1",
                                        "text_output": delta.text}
                if delta.finish_reason:
                    data["finish_reason"] = delta.finish_reason
                yield data
                delta = await anext(stream, None)
        finally:
            await stream.aclose()  # client gone or done: stop the engine request

    return relay(events(), error_body=lambda e: error_body(getattr(e, "message", "generation failed")),
                 done=None, ping_s=15.0, on_close=d.close)
