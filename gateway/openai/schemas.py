"""Pydantic request schemas for the OpenAI routes.

Chat and completion requests (and chat messages) refuse fields they do not declare,
as OpenAI does ("Unrecognized request argument supplied: X", a 400): a vLLM extra
the gateway does not know could change the prompt the engine runs (truncation,
documents, prompt embeddings, template variables) after the gateway has checked
quota and context on another. The declared fields are the OpenAI ones and the vLLM
extras the gateway itself honours. Other bodies (tokenize, embeddings) still accept
and ignore unknown fields. Range checks raise 400s through the validation handler in
`gateway.http.error_handlers`.

OpenAI request bodies → the LLM layer's protocol-neutral `GenerationParams`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engines.errors import ErrorKind, SluiceError
from gateway.llm.params import GenerationParams


class _Base(BaseModel):
    # NaN and infinities are not numbers a client may send (Python's JSON parser accepts them).
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StreamOptions(_Base):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Base):
    """Types only: the ranges (and the limits that depend on the model, such as top_k against
    the vocabulary) are checked once, protocol-neutrally, by `gateway.llm.params.check`."""

    model: str = Field(max_length=256)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(default=None, max_length=256)
    # OpenAI fields for OpenAI's own service (storage, billing, its cache routing): accepted, not acted on.
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # vLLM-style extras, honoured when the engine supports them.
    top_k: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    # The client's own split of its tenant's prefix cache; the engine's salt is derived from the
    # tenant and this (gateway.security.tenancy), so it never names another tenant's cache.
    cache_salt: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[^@/\\\x00]+$")


class VllmExtras(BaseModel):
    """vLLM's sampling extras the Responses and Messages routes take as chat does (chat declares them
    in `_Sampling`), so a client of any API can ask the engine for the same things."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    seed: int | None = None
    top_k: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    structured_outputs: dict[str, Any] | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[^@/\\\x00]+$")

    def vllm_extras(self) -> dict[str, Any]:
        """The extras as chat request fields."""
        return self.model_dump(include=set(VllmExtras.model_fields), exclude_none=True)


class ContentPart(_Base):
    type: str
    text: str | None = None


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    # What an assistant message of an earlier response carries (OpenAI's, and vLLM's reasoning), so a
    # client can send it back as history. Accepted but neither rendered nor forwarded: a worker's
    # template must not see what the gateway's did not (`RENDERED_MESSAGE_FIELDS`).
    refusal: str | None = None
    audio: Any = None
    function_call: Any = None
    annotations: Any = None
    reasoning: Any = None
    reasoning_content: Any = None


RENDERED_MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")
# What a remote worker's chat endpoint is sent of the client's body: what the gateway rendered the
# prompt from, and what the worker's own tool and structured-output parsers need. Sampling fields
# travel as the validated `SamplingParams` (engines.remote.payload), the cache salt as the tenant's.
FORWARDED_CHAT_FIELDS = ("messages", "tools", "tool_choice", "parallel_tool_calls", "response_format",
                         "structured_outputs", "add_generation_prompt", "continue_final_message",
                         "chat_template_kwargs", "chat_template")


class ChatTemplateFields(_Base):
    """What the chat template is rendered with; chat and /tokenize share these."""

    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None  # vLLM's extra; refused unless the operator allows client templates


class ChatCompletionRequest(ChatTemplateFields, _Sampling):
    model_config = _Strict.model_config

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's decoding constraint (choice, regex, json...)
    # OpenAI fields these text models cannot honour, or (reasoning_effort: a template variable in
    # vLLM) that would change the prompt the worker renders: refused when set (`refuse_unsupported`).
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    functions: Any = None
    function_call: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None

    @model_validator(mode="after")
    def _limits(self) -> ChatCompletionRequest:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


class CompletionRequest(_Sampling):
    model_config = _Strict.model_config

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt must not be an empty list")
            if any(isinstance(p, list) and not p for p in v):
                raise ValueError("a token-id prompt must not be empty")
        return v


class EmbeddingRequest(_Base):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("input must not be an empty list")
        if isinstance(v, list) and len(v) > 2048:
            raise ValueError("at most 2048 inputs per request")
        return v


class TokenizeRequest(ChatTemplateFields):
    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True

    @model_validator(mode="after")
    def _one(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        return self


class DetokenizeRequest(_Base):
    model: str
    tokens: list[int]


_UNSUPPORTED_CHAT = ("audio", "prediction", "functions", "function_call", "web_search_options", "reasoning_effort",
                     "verbosity")


def refuse_unsupported(body: ChatCompletionRequest) -> None:
    """A 400 naming the first OpenAI chat field set that this server does not honour."""
    for name in _UNSUPPORTED_CHAT:
        if getattr(body, name) is not None:
            raise SluiceError(f"'{name}' is not supported by this server", ErrorKind.UNSUPPORTED, param=name)
    if body.modalities is not None and body.modalities != ["text"]:
        raise SluiceError("only the 'text' modality is supported", ErrorKind.UNSUPPORTED, param="modalities")


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
