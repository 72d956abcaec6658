"""OpenAI request bodies → the LLM layer's protocol-neutral `GenerationParams`."""

from __future__ import annotations

from engines.errors import ErrorKind, SluiceError
from gateway.llm.params import GenerationParams
from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest


def requested_logprobs(body: ChatCompletionRequest | CompletionRequest) -> int | None:
    """Top alternatives per token, or None. Chat asks `logprobs: true, top_logprobs: k`;
    completions ask `logprobs: k`."""
    if isinstance(body, ChatCompletionRequest):
        return (body.top_logprobs or 0) if body.logprobs else None
    return body.logprobs


def logit_bias(raw: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI keys the map by token id as a string."""
    out = []
    for key, bias in (raw or {}).items():
        if not key.lstrip("-").isdigit() or len(key) > 12:
            raise SluiceError(f"Invalid value for 'logit_bias': key {key[:20]!r} is not a token id",
                              ErrorKind.INVALID_ARG, param="logit_bias")
        out.append((int(key), bias))
    return tuple(out)


def generation_params(body: ChatCompletionRequest | CompletionRequest) -> GenerationParams:
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return GenerationParams(
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        seed=body.seed,
        stop=stop,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
        repetition_penalty=body.repetition_penalty,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logprobs=requested_logprobs(body),
        logit_bias=logit_bias(body.logit_bias),
        include_stop_str_in_output=body.include_stop_str_in_output,
        n=body.n,
    )
