"""Protocol-neutral generation parameters, and their check against a model's real limits.

Each protocol edge (OpenAI body, KServe generate parameters, gRPC parameters)
builds a `GenerationParams`; `sampling_for` checks it and turns it into the
engine's `SamplingParams` for one prompt, raising domain errors. Nothing a client
sends reaches an engine without passing through here, and every value has a bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engines.base import GREEDY_BELOW_TEMPERATURE, SamplingParams
from engines.errors import ErrorKind, SluiceError
from gateway.llm.registry import LLMModel

# Bounds on what one request may ask for. OpenAI's own limits where it has one.
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 1024
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 300  # entries; each bias in [-100, 100]
MAX_TOP_LOGPROBS = 20
MAX_CHOICES = 128  # n
SEED_RANGE = (-(2**63), 2**63 - 1)  # int64, as vLLM and the OpenAI API take it


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
    logit_bias: tuple[tuple[int, float], ...] = ()
    include_stop_str_in_output: bool = False
    n: int = 1  # choices per prompt


def _bad(param: str, message: str) -> SluiceError:
    return SluiceError(f"Invalid value for '{param}': {message}", ErrorKind.INVALID_ARG, param=param)


def _check_numbers(p: GenerationParams) -> None:
    ranges = {"temperature": (p.temperature, 0.0, 2.0), "top_p": (p.top_p, 0.0, 1.0),
              "min_p": (p.min_p, 0.0, 1.0), "repetition_penalty": (p.repetition_penalty, 0.0, 10.0),
              "presence_penalty": (p.presence_penalty, -2.0, 2.0),
              "frequency_penalty": (p.frequency_penalty, -2.0, 2.0)}
    for name, (value, low, high) in ranges.items():
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            raise _bad(name, f"must be a number in [{low}, {high}], got {value!r}")
    if p.top_p is not None and p.top_p <= 0.0:
        raise _bad("top_p", "must be greater than 0")
    if p.repetition_penalty <= 0.0:
        raise _bad("repetition_penalty", "must be greater than 0")
    if p.seed is not None and not SEED_RANGE[0] <= p.seed <= SEED_RANGE[1]:
        raise _bad("seed", "must fit in a signed 64-bit integer")
    if not 1 <= p.n <= MAX_CHOICES:
        raise _bad("n", f"must be in [1, {MAX_CHOICES}]")
    if p.logprobs is not None and not 0 <= p.logprobs <= MAX_TOP_LOGPROBS:
        raise _bad("logprobs", f"at most {MAX_TOP_LOGPROBS} alternatives per token")
    if p.max_tokens is not None and p.max_tokens < 0:
        raise _bad("max_tokens", "must be at least 0")
    if p.min_tokens < 0 or (p.max_tokens is not None and p.min_tokens > p.max_tokens):
        raise _bad("min_tokens", "must be between 0 and max_tokens")


def _check_tokens(p: GenerationParams, vocab: int) -> None:
    if p.top_k is not None and p.top_k != -1 and not 1 <= p.top_k <= vocab:
        raise _bad("top_k", f"must be -1 (disabled) or in [1, {vocab}] (the vocabulary size), got {p.top_k}")
    if len(p.stop) > MAX_STOP_STRINGS:
        raise _bad("stop", f"at most {MAX_STOP_STRINGS} stop sequences are allowed")
    if any(not s or len(s) > MAX_STOP_STRING_CHARS for s in p.stop):
        raise _bad("stop", f"stop sequences must be 1 to {MAX_STOP_STRING_CHARS} characters")
    if len(p.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise _bad("stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} ids")
    if any(not 0 <= t < vocab for t in p.stop_token_ids):
        raise _bad("stop_token_ids", f"ids must be in [0, {vocab})")
    if len(p.logit_bias) > MAX_LOGIT_BIAS:
        raise _bad("logit_bias", f"at most {MAX_LOGIT_BIAS} entries")
    for token, bias in p.logit_bias:
        if not 0 <= token < vocab:
            raise _bad("logit_bias", f"token id {token} is outside the vocabulary [0, {vocab})")
        if not (math.isfinite(bias) and -100.0 <= bias <= 100.0):
            raise _bad("logit_bias", f"bias for token {token} must be in [-100, 100]")


def check(model: LLMModel, params: GenerationParams) -> None:
    """SluiceError(INVALID_ARG) naming the first parameter outside its bound."""
    _check_numbers(params)
    _check_tokens(params, model.tokenizer.vocab_size)


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


def _choice_seed(seed: int | None, offset: int) -> int | None:
    """Choice i samples with seed + i, wrapped into int64 so no seed overflows."""
    if seed is None:
        return None
    return (seed + offset - SEED_RANGE[0]) % 2**64 + SEED_RANGE[0]


def sampling_for(model: LLMModel, params: GenerationParams, prompt_len: int, *, seed_offset: int = 0
                 ) -> SamplingParams:
    """SamplingParams for one prompt and choice (call `check` first), or SluiceError(CONTEXT_TOO_LONG)."""
    error = context_error(model, prompt_len, params.max_tokens)
    if error is not None:
        raise error
    max_tokens = params.max_tokens if params.max_tokens is not None else model.context_length - prompt_len
    temperature = 1.0 if params.temperature is None else params.temperature
    # A temperature this small under-flows the logits to inf/NaN: it means greedy.
    if temperature < GREEDY_BELOW_TEMPERATURE:
        temperature = 0.0
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=temperature,
            top_p=1.0 if params.top_p is None else params.top_p,
            top_k=-1 if params.top_k is None else params.top_k,
            min_p=params.min_p, seed=_choice_seed(params.seed, seed_offset), stop=params.stop,
            stop_token_ids=params.stop_token_ids, ignore_eos=params.ignore_eos, min_tokens=params.min_tokens,
            repetition_penalty=params.repetition_penalty, presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty, logprobs=params.logprobs, logit_bias=params.logit_bias,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
    except ValueError as e:
        raise SluiceError(str(e), ErrorKind.INVALID_ARG) from None
