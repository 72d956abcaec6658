"""Pydantic request schema for OpenAI's Responses API (`POST /v1/responses`).

Fields the gateway does not declare are refused (a 400 naming them), as on chat. Every list and
string a client sends has a bound here; the conversation as a whole is bounded again when it is
rendered (`--max-prompt-chars`). What a text model behind this gateway cannot do (images, files,
built-in tools, background runs, server-side conversations) is refused by name in `convert`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from gateway.openai.schemas import VllmExtras

MAX_ITEMS = 4096
MAX_PARTS = 1024
MAX_TOOLS = 512
ID = r"^[A-Za-z0-9_-]{1,128}$"
FUNCTION_NAME = r"^[a-zA-Z0-9_.-]{1,128}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class Part(_Loose):
    """A content part: `input_text`, `output_text` and `refusal` carry text; others are refused."""

    type: str = Field(max_length=64)
    text: str | None = None
    refusal: str | None = None


class MessageItem(_Loose):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part] = Field(max_length=MAX_PARTS)
    id: str | None = Field(default=None, max_length=128)
    status: str | None = Field(default=None, max_length=32)


class FunctionCallItem(_Loose):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(pattern=FUNCTION_NAME)
    arguments: str = ""
    id: str | None = Field(default=None, max_length=128)
    status: str | None = Field(default=None, max_length=32)


class FunctionCallOutputItem(_Loose):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | list[Part]
    id: str | None = Field(default=None, max_length=128)
    status: str | None = Field(default=None, max_length=32)


class ReasoningItem(_Loose):
    """An earlier answer's reasoning, sent back as history: accepted, never rendered."""

    type: Literal["reasoning"]


class OtherItem(_Loose):
    """An item a text model behind this gateway cannot take (built-in tool calls, references):
    refused by name when converted."""

    type: str = Field(max_length=64)


def _item_tag(v: Any) -> str:
    kind = v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", None)
    return kind if kind in ("message", "function_call", "function_call_output", "reasoning") else "other"


Item = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")] | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_tag),
]


class FunctionTool(_Loose):
    type: str = Field(max_length=64)  # "function"; built-in tools (web_search, ...) are refused
    name: str | None = Field(default=None, pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(_Strict):
    type: Literal["text", "json_schema", "json_object"]
    name: str | None = Field(default=None, max_length=128)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: str | None = Field(default=None, max_length=16)  # a hint for OpenAI's models: not acted on


class ResponsesRequest(_Strict, VllmExtras):
    """vLLM's extras (`VllmExtras`) come as Sluice's chat takes them."""

    model: str = Field(max_length=256)
    input: str | list[Item] = Field(max_length=MAX_ITEMS)
    instructions: str | None = None
    previous_response_id: str | None = Field(default=None, pattern=ID)
    tools: list[FunctionTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=16)
    include: list[Annotated[str, Field(max_length=128)]] | None = Field(default=None, max_length=16)
    user: str | None = Field(default=None, max_length=256)
    truncation: Literal["auto", "disabled"] | None = None
    # Routing: requests that share this key go to the worker holding their prefix (as OpenAI uses it).
    prompt_cache_key: str | None = Field(default=None, max_length=256)
    safety_identifier: str | None = Field(default=None, max_length=256)
    service_tier: str | None = Field(default=None, max_length=32)
    # OpenAI features this server refuses when set (`convert.refuse_unsupported`).
    reasoning: dict[str, Any] | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: int | None = Field(default=None, ge=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
