"""What the simulated engine hands back: per-request outputs, step results, counters. Pure."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from engines.sim.model.kv_events import KVEvent
from engines.sim.model.request import SimFinishReason


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """One request's progress in one step: at most one new token (none for a prefill chunk)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finish_reason: SimFinishReason | None
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache (whole blocks)
    completion_tokens: int  # cumulative
    # Virtual seconds from arrival to the end of the step that made the first token;
    # set on that output only (the metric vllm:time_to_first_token_seconds).
    ttft_s: float | None = None
    # Virtual seconds since this request's previous token, on every later output
    # (the metric vllm:inter_token_latency_seconds).
    itl_s: float | None = None


@dataclass(frozen=True, slots=True)
class StepResult:
    """One engine step. Its outputs and events exist at `end_s`, not before:
    a driver delivers them then, and the next step may start then."""

    start_s: float
    duration_s: float
    outputs: tuple[RequestOutput, ...] = ()
    kv_events: tuple[KVEvent, ...] = ()
    prefill_tokens: int = 0  # uncached prompt (and recomputed) tokens this step ran
    decode_seqs: int = 0
    preempted: tuple[str, ...] = ()  # request ids sent back to the waiting queue

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    @property
    def idle(self) -> bool:
        """Nothing ran: no work, or none that fits yet."""
        return self.prefill_tokens == 0 and self.decode_seqs == 0


@dataclass(slots=True)
class EngineCounters:
    """Monotonic totals since start, the counters of vLLM's /metrics."""

    prompt_tokens: int = 0  # prompt tokens of requests that produced their first token
    prompt_tokens_cached: int = 0  # of those, served from the prefix cache
    generation_tokens: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up at admission
    prefix_cache_hits: int = 0  # of those, found cached
    num_preemptions: int = 0
    steps: int = 0  # steps that ran something
    batched_steps: int = 0  # of those, steps that ran more than one request
    max_batch: int = 0  # largest number of requests in one step
    finished: Counter[str] = field(default_factory=Counter)  # finished requests by reason
