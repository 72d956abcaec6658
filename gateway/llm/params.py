"""Protocol-neutral generation parameters, and their check against a model's real limits.

Each protocol edge (OpenAI body, KServe generate parameters, gRPC parameters)
builds a `GenerationParams`; `sampling_for` turns it into the engine's
`SamplingParams` for one prompt, raising domain errors. Nothing a client sends
reaches an engine without passing through here.
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.base import SamplingParams
from engines.errors import ErrorKind, SluiceError
from gateway.llm.registry import LLMModel


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """What the client asked for; None means "the engine's default"."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # top alternatives per token; None: not requested
    include_stop_str_in_output: bool = False
    n: int = 1  # choices per prompt


def context_error(model: LLMModel, prompt_len: int, max_tokens: int | None) -> SluiceError | None:
    """The context-length refusal for a prompt and a requested completion, if any."""
    limit = model.context_length
    if prompt_len >= limit:
        return SluiceError(f"This model's maximum context length is {limit} tokens. However, your prompt has "
                           f"{prompt_len} tokens.", ErrorKind.CONTEXT_TOO_LONG, code="context_length_exceeded",
                           param="messages")
    if max_tokens is not None and prompt_len + max_tokens > limit:
        return SluiceError(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the completion). "
            "Please reduce the prompt or max_tokens.", ErrorKind.CONTEXT_TOO_LONG, code="context_length_exceeded",
            param="max_tokens")
    return None


def sampling_for(model: LLMModel, params: GenerationParams, prompt_len: int, *, seed_offset: int = 0
                 ) -> SamplingParams:
    """SamplingParams for one prompt and choice, or SluiceError(INVALID_ARG / CONTEXT_TOO_LONG)."""
    error = context_error(model, prompt_len, params.max_tokens)
    if error is not None:
        raise error
    max_tokens = params.max_tokens if params.max_tokens is not None else model.context_length - prompt_len
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if params.temperature is None else params.temperature,
            top_p=1.0 if params.top_p is None else params.top_p,
            top_k=-1 if params.top_k is None else params.top_k,
            min_p=params.min_p,
            seed=None if params.seed is None else params.seed + seed_offset,
            stop=params.stop,
            stop_token_ids=params.stop_token_ids,
            ignore_eos=params.ignore_eos,
            min_tokens=params.min_tokens,
            repetition_penalty=params.repetition_penalty,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            logprobs=params.logprobs,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
    except ValueError as e:
        raise SluiceError(str(e), ErrorKind.INVALID_ARG) from None
