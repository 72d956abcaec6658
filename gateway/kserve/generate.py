"""KServe generate / generate_stream for LLM models, over the injected LLM service.

Body: `{"text_input": "...", "parameters": {...}}` (other top-level keys are
merged into the parameters, as Triton maps them to inputs). Response:
`{"model_name", "model_version", "text_output"}`; the stream is SSE `data: {...}`
per delta, ending with an error event rather than hanging if the engine fails.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from sse_starlette.sse import EventSourceResponse

from engines.base import EngineError
from engines.classic.errors import Code, InferError, invalid, not_found


def _status_code(exc: EngineError) -> Code:
    if exc.kind in (Code.NOT_FOUND, Code.INVALID_ARG, Code.UNAVAILABLE, Code.INTERNAL, Code.UNSUPPORTED):
        return exc.kind
    return Code.INVALID_ARG if exc.kind is Code.CONTEXT_TOO_LONG else Code.UNAVAILABLE


def parse_body(llm: Any, name: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if llm is None or not llm.has_model(name):
        raise not_found(f"Request for unknown model: '{name}' is not found")
    prompt = body.get("text_input", body.get("prompt"))
    if not isinstance(prompt, str):
        raise invalid("generate needs a string 'text_input'")
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise invalid("'parameters' must be a JSON object")
    extra = {k: v for k, v in body.items() if k not in ("text_input", "prompt", "parameters", "id")}
    return prompt, {**extra, **params}


async def deltas(llm: Any, name: str, prompt: str, params: dict[str, Any]) -> AsyncIterator[Any]:
    try:
        async for delta in llm.generate_text(name, prompt, params):
            yield delta
    except EngineError as exc:
        raise InferError(exc.message, _status_code(exc)) from None


async def generate_once(llm: Any, name: str, version: str, body: dict[str, Any]) -> dict[str, Any]:
    prompt, params = parse_body(llm, name, body)
    text = []
    async for delta in deltas(llm, name, prompt, params):
        if delta.finish_reason == "error":
            raise InferError(delta.error or "generation failed", Code.INTERNAL)
        text.append(delta.text)
    return {"model_name": name, "model_version": version or "1", "text_output": "".join(text)}


async def generate_sse(llm: Any, name: str, version: str, body: dict[str, Any]) -> EventSourceResponse:
    prompt, params = parse_body(llm, name, body)
    stream = deltas(llm, name, prompt, params)
    # Pull the first delta before answering, so refusals get a proper status code.
    first = await anext(stream, None)

    async def events() -> AsyncIterator[dict[str, str]]:
        delta = first
        try:
            while delta is not None:
                data: dict[str, Any] = {"model_name": name, "model_version": version or "1",
                                        "text_output": delta.text}
                if delta.finish_reason:
                    data["finish_reason"] = delta.finish_reason
                if delta.finish_reason == "error":
                    data["error"] = delta.error or "generation failed"
                yield {"data": json.dumps(data)}
                delta = await anext(stream, None)
        except InferError as exc:
            yield {"data": json.dumps({"error": exc.message})}
        finally:
            await stream.aclose()  # client gone or done: stop the engine request

    return EventSourceResponse(events(), ping=15)
