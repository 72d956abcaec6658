"""Build the JSON body a remote OpenAI-compatible worker receives (pure, no I/O).

Contract: `build_body(request, dialect, served_model)` returns `(path, body)`.
- chat requests: the gateway's `chat_body` is the base (it carries messages, tools,
  response_format... which the engine's own parsers need); the validated
  `SamplingParams` are laid over it, because the gateway clamped them.
- completion requests: the prompt is sent as token ids, so the worker runs exactly
  the ids the router hashed.
Both always stream with usage, so the final chunk carries prompt/cached tokens.
"""

from __future__ import annotations

from typing import Any, Literal

from engines.base import EngineRequest, SamplingParams

Dialect = Literal["vllm", "trtllm", "openai"]
DIALECTS: tuple[str, ...] = ("vllm", "trtllm", "openai")
# Dialects sent the engine request's `cache_salt`: their prefix cache is namespaced by it. The
# others (trtllm-serve, plain OpenAI servers) take no salt; the router hashes their prefixes unsalted.
SALTED_DIALECTS: frozenset[str] = frozenset({"vllm"})

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"

# Client fields the gateway owns: one engine request is one choice, and the
# clamped max_tokens must win over whatever the client sent.
_DROPPED_CHAT_KEYS = ("n", "max_completion_tokens", "stream", "stream_options", "logprobs", "top_logprobs")

# Chat fields each dialect is sent of the client's body. trtllm-serve and plain OpenAI servers
# refuse unknown fields; vLLM would act on any of its extras, some of which change the prompt it
# renders (documents, truncate_prompt_tokens, add_special_tokens...) after the gateway checked
# another, so it gets only what the gateway rendered from and its tool parsers need. No list holds
# `cache_salt`: the engine request's (the tenant's namespace) is the only one sent.
_OPENAI_CHAT_KEYS = frozenset({
    "messages", "model", "frequency_penalty", "logit_bias", "max_tokens", "presence_penalty",
    "response_format", "seed", "stop", "temperature", "top_p", "tools", "tool_choice",
    "parallel_tool_calls", "user",
})
_TRTLLM_CHAT_KEYS = _OPENAI_CHAT_KEYS | {
    "top_k", "min_p", "repetition_penalty", "stop_token_ids", "ignore_eos", "min_tokens",
    "include_stop_str_in_output", "skip_special_tokens", "chat_template_kwargs",
}
_VLLM_CHAT_KEYS = _OPENAI_CHAT_KEYS | {
    "add_generation_prompt", "continue_final_message", "chat_template_kwargs", "chat_template",
    "structured_outputs",  # constrains decoding, not the prompt
}
_ALLOWED_CHAT_KEYS = {"openai": _OPENAI_CHAT_KEYS, "trtllm": _TRTLLM_CHAT_KEYS, "vllm": _VLLM_CHAT_KEYS}


def sampling_fields(sp: SamplingParams, dialect: Dialect, *, chat: bool) -> dict[str, Any]:
    """OpenAI fields plus the vLLM-style extras, leaving defaults out.

    Defaults are omitted so that a plain OpenAI server (dialect "openai"), which
    rejects or ignores unknown fields, still accepts requests that do not use them.
    """
    body: dict[str, Any] = {"max_tokens": sp.max_tokens, "temperature": sp.temperature, "top_p": sp.top_p}
    if sp.seed is not None:
        body["seed"] = sp.seed
    if sp.stop:
        body["stop"] = list(sp.stop)
    if sp.presence_penalty:
        body["presence_penalty"] = sp.presence_penalty
    if sp.frequency_penalty:
        body["frequency_penalty"] = sp.frequency_penalty
    if sp.logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in sp.logit_bias}
    if sp.logprobs is not None:
        if chat:
            body["logprobs"] = True
            body["top_logprobs"] = sp.logprobs
        else:
            body["logprobs"] = sp.logprobs
    if dialect == "openai":
        return body
    # vLLM and trtllm-serve both accept these engine extras at the top level.
    extras: dict[str, Any] = {
        "top_k": sp.top_k if sp.top_k != -1 else None,
        "min_p": sp.min_p or None,
        "repetition_penalty": sp.repetition_penalty if sp.repetition_penalty != 1.0 else None,
        "stop_token_ids": list(sp.stop_token_ids) or None,
        "ignore_eos": sp.ignore_eos or None,
        "min_tokens": sp.min_tokens or None,
        "include_stop_str_in_output": sp.include_stop_str_in_output or None,
    }
    body.update({k: v for k, v in extras.items() if v is not None})
    return body


def build_body(request: EngineRequest, dialect: Dialect, served_model: str | None = None, *,
               priority: bool = False) -> tuple[str, dict[str, Any]]:
    """Return the worker path and JSON body for `request` (see module docstring). `priority`: the
    worker schedules by priority (vLLM --scheduling-policy priority), so the request's is sent."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown worker dialect {dialect!r}; expected one of {DIALECTS}")
    chat = request.kind == "chat"
    if chat:
        if request.chat_body is None:
            raise ValueError("a chat EngineRequest needs chat_body to reach a remote worker")
        allowed = _ALLOWED_CHAT_KEYS[dialect]
        body = {k: v for k, v in request.chat_body.items() if k not in _DROPPED_CHAT_KEYS and k in allowed}
    else:
        body = {"prompt": list(request.prompt_token_ids)}
    # vLLM and TRT-LLM serve a LoRA adapter under its own model name.
    body["model"] = request.lora or served_model or request.model
    body.update(sampling_fields(request.sampling, dialect, chat=chat))
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if dialect == "vllm":
        # Token ids per chunk let Delta carry ids and exact cumulative counts.
        body["return_token_ids"] = True
    if dialect in SALTED_DIALECTS and request.cache_salt is not None:
        body["cache_salt"] = request.cache_salt
    if priority and dialect == "vllm" and request.priority:
        body["priority"] = request.priority  # vLLM refuses one other than 0 unless it schedules by it
    return (CHAT_PATH if chat else COMPLETIONS_PATH), body
