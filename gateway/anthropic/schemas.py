"""Pydantic request schemas for Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`).

Bodies refuse fields they do not declare, as the chat schemas do: a field the gateway did not check
must not change what the engine runs. Every list and string a client sends has a bound here; the
prompt as a whole is bounded again when it is rendered (`--max-prompt-chars`) and tokenized.
Content that a text model cannot take (images, documents) and extended thinking are refused with a
400 naming them (`gateway.anthropic.convert`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from gateway.openai.schemas import VllmExtras

MAX_MESSAGES = 4096
MAX_BLOCKS = 1024
MAX_TOOLS = 512
MAX_STOP_SEQUENCES = 32
TOOL_NAME = r"^[a-zA-Z0-9_-]{1,128}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Loose(BaseModel):
    """Blocks and tools carry fields for Anthropic's own service (cache_control, citations):
    accepted, not acted on."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class TextBlock(_Loose):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Loose):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(pattern=TOOL_NAME)
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(_Loose):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[ResultPart] | None = None
    is_error: bool = False


class ThinkingBlock(_Loose):
    """An earlier answer's reasoning, sent back as history: accepted, never rendered."""

    type: Literal["thinking", "redacted_thinking"]


class OtherBlock(_Loose):
    """A block a text model cannot take (image, document, ...): refused by name when converted."""

    type: str = Field(max_length=64)


_KNOWN = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")


def _block_tag(v: Any) -> str:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    if kind in ("thinking", "redacted_thinking"):
        return "thinking"
    return kind if kind in _KNOWN else "other"


Block = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")] | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[OtherBlock, Tag("other")],
    Discriminator(_block_tag),
]
ResultPart = Annotated[Annotated[TextBlock, Tag("text")] | Annotated[OtherBlock, Tag("other")],
                       Discriminator(lambda v: "text" if _block_tag(v) == "text" else "other")]
ToolResultBlock.model_rebuild()


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block] = Field(max_length=MAX_BLOCKS)


class Tool(_Loose):
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    type: str | None = Field(default=None, max_length=64)  # "custom", or a server tool (refused)


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(default=None, pattern=TOOL_NAME)
    disable_parallel_tool_use: bool | None = None


class Metadata(_Strict):
    user_id: str | None = Field(default=None, max_length=256)


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    effort: str | None = Field(default=None, max_length=16)  # how hard Claude thinks: not acted on here
    format: OutputFormat | None = None  # structured output: the engine's JSON-schema decoding


class Conversation(_Strict):
    model: str = Field(max_length=256)
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: str | list[TextBlock] | None = Field(default=None)
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None  # refused unless disabled
    output_config: OutputConfig | None = None
    container: Any = None  # Anthropic's code-execution containers: refused when set
    # For Anthropic's own service (prompt-cache breakpoints, cache diagnostics, region, speed tier,
    # workspaces): accepted, not acted on. Sluice's prefix caching needs no breakpoints.
    cache_control: dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    inference_geo: str | None = Field(default=None, max_length=64)
    speed: str | None = Field(default=None, max_length=16)
    user_profile_id: str | None = Field(default=None, max_length=256)
    workspace_id: str | None = Field(default=None, max_length=256)


class MessagesRequest(Conversation, VllmExtras):
    """vLLM's extras (`VllmExtras`, top_k among them) come as Sluice's chat takes them."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        default=None, max_length=MAX_STOP_SEQUENCES)
    stream: bool = False
    # Sampling, as the Messages API long took it (current SDKs send it through extra_body).
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    metadata: Metadata | None = None
    service_tier: str | None = Field(default=None, max_length=64)  # Anthropic's own: accepted, not acted on


class CountTokensRequest(Conversation):
    pass
