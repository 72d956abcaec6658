"""The LLM engine seam: what the gateway needs from anything that generates tokens.

Every engine (in-process transformers, a remote vLLM or TensorRT-LLM worker, the
`sim` model) implements :class:`LLMEngine`. The gateway validates and tokenizes a
request, builds an :class:`EngineRequest`, and relays the :class:`Delta` stream.

Nothing here imports torch, FastAPI or the router.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from engines.errors import SluiceError

FinishReason = Literal["stop", "length", "abort", "error", "tool_calls"]
# Below this a temperature under-flows the logits (inf, then NaN): it is sampled as greedy.
GREEDY_BELOW_TEMPERATURE = 1e-5


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling, in vLLM's conventions (which OpenAI's map onto)."""

    max_tokens: int  # new tokens at most; the gateway has already clamped it to the context
    temperature: float = 1.0  # 0.0 means greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 disables top-k
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # number of top logprobs per token; None: not requested
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE or self.top_k == 1


@dataclass(slots=True)
class EngineRequest:
    """One generation, as the engine sees it.

    `prompt_token_ids` are the exact ids the engine will run (the gateway rendered
    the chat template with the model's own tokenizer). Remote engines may instead
    forward `chat_body` to the worker's own chat endpoint, so that the engine's tool
    and reasoning parsers apply; the ids are then used for routing and accounting.
    """

    request_id: str
    model: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    kind: Literal["chat", "completion"] = "completion"
    # OpenAI chat body to forward to a remote worker (model name already rewritten).
    chat_body: dict[str, Any] | None = None
    lora: str | None = None
    cache_salt: str | None = None
    # W3C trace context (`traceparent`, `tracestate`) of the gateway's span for this attempt;
    # remote engines send it as request headers, so the worker's spans join the trace.
    trace_headers: dict[str, str] | None = None
    # The API request's id (the gateway's X-Request-Id): a remote worker gets it as its own X-Request-Id,
    # so its logs and spans name the request as the client and the gateway do. Not unique (every choice
    # of a request shares it; clients may reuse theirs): `request_id` is. None: `request_id` is sent.
    api_request_id: str | None = None
    # The engine's scheduling priority, vLLM's convention (lower runs earlier, 0 the default): sent only
    # to workers that schedule by it (vLLM `--scheduling-policy priority`).
    priority: int = 0
    # The consumer takes runs of plain text still JSON-escaped (`Delta.text_json`): a remote engine
    # then relays its worker's plain events without decoding them in full (engines.remote.splice).
    text_json: bool = False


@dataclass(slots=True)
class Delta:
    """A piece of output. Deltas of one request arrive in order; the last has finish_reason."""

    text: str = ""  # new text since the previous delta (stop strings already removed)
    token_ids: list[int] = field(default_factory=list)  # new token ids, when the engine exposes them
    finish_reason: FinishReason | None = None
    # Usage, filled at least on the final delta.
    prompt_tokens: int | None = None
    completion_tokens: int = 0  # cumulative
    cached_tokens: int | None = None  # prompt tokens served from the engine's prefix cache
    # Chat fields a remote engine's own parsers produced (tool_calls, reasoning_content).
    chat_extra: dict[str, Any] | None = None
    logprobs: list[dict[str, Any]] | None = None  # OpenAI-shaped per-token logprobs, when requested
    # Why an engine stopped with finish_reason "error".
    error: str | None = None
    # Only for a request with `text_json`: the text of a run of plain events as a JSON string body
    # (no quotes, as orjson writes it), in place of `text`; `token_ids` holds their ids when the worker
    # sent ids, and `completion_tokens` counts them. Never set with a finish reason, parser output or logprobs.
    text_json: bytes | None = None
    # The prompt as the engine ran it (a remote chat worker renders its own), on the first Delta that
    # follows the engine's report of it; None when it did not say. A resumed stream replays these ids.
    prompt_token_ids: list[int] | None = None
    # Why a stream that had started broke, on its final error Delta: "broken" (the worker's connection
    # failed) or "stalled" (it sent nothing for the stall bound). None for an error the engine itself
    # reported: only a lost worker's stream may be resumed elsewhere (gateway.llm.migration).
    fault: Literal["broken", "stalled"] | None = None


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's scheduler, for /metrics, tests and routing."""

    running: int  # requests currently in the running batch
    waiting: int  # requests admitted but not yet scheduled
    max_batch_size_seen: int = 0  # largest running batch since start (proves batching)
    # Forward passes since start, and those that ran more than one request: a test or an
    # operator can read batching over any window as the difference of two snapshots.
    steps: int = 0
    batched_steps: int = 0
    restarts: int = 0  # times a supervisor restarted the engine after its generation loop died


class EngineError(SluiceError):
    """An LLM engine refused or failed a request.

    `retryable` tells the gateway it may try another worker (only before the
    first byte has been sent to the client).
    """


@runtime_checkable
class LLMEngine(Protocol):
    """Contract for an LLM engine.

    - `generate` yields Deltas until one carries a finish_reason; it raises
      EngineError for a refusal before the first delta. After that, failures are
      reported as a final Delta with finish_reason "error".
    - `abort` is idempotent and safe for unknown ids; the matching `generate`
      ends promptly (with finish_reason "abort") and frees its batch slot.
    - Cancelling the task that iterates `generate` must abort the request.
    """

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, request: EngineRequest) -> AsyncGenerator[Delta, None]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    def ready(self) -> bool: ...
