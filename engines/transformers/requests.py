"""What the transformers engine checks and passes per request. Pure: no torch, no I/O.

The continuous-batching manager runs every request on one background thread; a
request it cannot run (an id outside the vocabulary, say) kills that thread for
every request, so everything is checked here, before it is submitted.
"""

from __future__ import annotations

from typing import Any

from engines.base import EngineError, SamplingParams
from engines.errors import ErrorKind

# A seed travels as a non-negative int32 (the sampler's argument tensor); -1 means none.
NO_SEED = -1
_SEED_MASK = 0x7FFFFFFF


def check_sampling(s: SamplingParams) -> None:
    """Refuse the sampling options transformers' continuous batching cannot apply per request."""
    if s.logprobs is not None:
        raise EngineError("logprobs are not supported by the transformers engine", ErrorKind.UNSUPPORTED,
                          param="logprobs")
    if s.logit_bias:
        raise EngineError("logit_bias is not supported by the transformers engine", ErrorKind.UNSUPPORTED,
                          param="logit_bias")
    if s.min_p or s.repetition_penalty != 1.0 or s.presence_penalty or s.frequency_penalty or s.min_tokens:
        raise EngineError(
            "min_p, min_tokens and repetition/presence/frequency penalties are not supported by the "
            "transformers engine", ErrorKind.UNSUPPORTED)


def check_prompt(ids: list[int], vocab_size: int, context_tokens: int) -> None:
    if not ids:
        raise EngineError("the prompt is empty", ErrorKind.INVALID_ARG, param="prompt")
    for t in ids:
        if type(t) is not int or not 0 <= t < vocab_size:
            raise EngineError(f"token id {t!r} is outside the vocabulary [0, {vocab_size})",
                              ErrorKind.INVALID_ARG, param="prompt")
    if len(ids) >= context_tokens:
        raise EngineError(f"the prompt has {len(ids)} tokens; the context is {context_tokens}",
                          ErrorKind.CONTEXT_TOO_LONG, code="context_length_exceeded", param="messages")


def sampling_kwargs(s: SamplingParams, vocab_size: int) -> dict[str, Any]:
    """Per-request logits-processor arguments for `add_request`. Greedy is top-k 1."""
    return {
        "temperature": 1.0 if s.greedy else float(s.temperature),
        # top_k above the vocabulary would make the processor index past the logits.
        "top_k": 1 if s.greedy else (min(s.top_k, vocab_size) if s.top_k > 0 else vocab_size),
        "top_p": 1.0 if s.greedy else float(s.top_p),
        "sluice_seed": NO_SEED if (s.seed is None or s.greedy) else int(s.seed) & _SEED_MASK,
    }


def end_token_ids(s: SamplingParams, eos_ids: list[int]) -> list[int]:
    """The ids that end generation: the model's EOS ids (unless ignored) and the request's stop ids."""
    ids = [] if s.ignore_eos else list(eos_ids)
    ids += [t for t in s.stop_token_ids if t not in ids]
    return ids
