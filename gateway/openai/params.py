"""OpenAI request bodies → the LLM layer's protocol-neutral `GenerationParams`."""

from __future__ import annotations

from gateway.llm.params import GenerationParams
from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest


def requested_logprobs(body: ChatCompletionRequest | CompletionRequest) -> int | None:
    """Top alternatives per token, or None. Chat asks `logprobs: true, top_logprobs: k`;
    completions ask `logprobs: k`."""
    if isinstance(body, ChatCompletionRequest):
        return int(body.top_logprobs or 0) if body.logprobs else None
    return body.logprobs


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
        include_stop_str_in_output=body.include_stop_str_in_output,
        n=body.n,
    )
