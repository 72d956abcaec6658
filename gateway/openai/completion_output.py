"""Completion responses from a dispatch's deltas: `text_completion` events, or one `text_completion`.

Choice `i` of a request with several prompts answers prompt `i // n`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from gateway.llm.dispatch import Dispatch
from gateway.llm.service import Prompt
from gateway.openai.chat_output import finish_reason, raise_if_failed
from gateway.openai.chunks import ChunkEncoder
from gateway.openai.logprobs import CompletionLogprobs
from gateway.openai.schemas import CompletionRequest
from gateway.openai.usage import UsageTally


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
