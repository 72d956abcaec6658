"""What the LLM layer records about each request: timings, token counts, admission gauges; and
its seam to per-key token quotas (`TokenQuota`, implemented by `gateway.security.quotas.QuotaService`)."""

from __future__ import annotations

import time
from typing import Protocol

from engines.base import Delta, EngineRequest
from gateway.llm.metrics import LLMMetrics
from gateway.llm.registry import LLMModel


class StreamClock:
    """Per-attempt timing: TTFT on the first visible delta, inter-token latency after."""

    def __init__(self, metrics: LLMMetrics, model: str, t0: float, exemplar: dict[str, str] | None = None, *,
                 ttft: bool = True) -> None:
        self.m, self.model, self.exemplar = metrics, model, exemplar  # the TTFT's exemplar (the request's trace)
        self.ttft = ttft  # False for an attempt that resumes an answer: its first token is no TTFT
        self.itl = metrics.itl.labels(model)  # looked up once: `labels()` per token cost more than the observation
        self.t0 = self.last_t = t0
        self.first = True
        self.reported_cached: int | None = None

    def tick(self, delta: Delta) -> bool:
        """Record one delta; True when it is the attempt's first token."""
        now = time.monotonic()
        visible = bool(delta.text or delta.token_ids or delta.chat_extra or delta.text_json is not None)
        first = self.first and (visible or delta.finish_reason is not None)
        if first:
            if self.ttft:
                self.m.ttft.labels(self.model).observe(now - self.t0, self.exemplar)
            self.first = False
        elif visible:
            self.itl.observe(now - self.last_t)
        self.last_t = now
        if delta.cached_tokens is not None:
            self.reported_cached = delta.cached_tokens
        return first


def account_finished(metrics: LLMMetrics, model: str, request: EngineRequest, last: Delta) -> None:
    m = metrics
    m.prompt_tokens.labels(model).inc(last.prompt_tokens or len(request.prompt_token_ids))
    m.generation_tokens.labels(model).inc(last.completion_tokens)
    if last.cached_tokens:
        m.cached_tokens.labels(model).inc(last.cached_tokens)
    m.finished.labels(model, last.finish_reason or "unknown").inc()


def gauge_admission(metrics: LLMMetrics, model: LLMModel) -> None:
    metrics.inflight.labels(model.name).set(model.admission.running)
    metrics.queued.labels(model.name).set(model.admission.queued)


class TokenQuota(Protocol):
    """`LLMService.dispatch` calls `reserve_tokens` with a request's prompt tokens before
    it ranks and admits (the only await of a dispatch), `refund_tokens` if the request
    is then refused before it runs, and `commit_tokens` exactly once when its
    `Dispatch` closes, with the completion tokens it produced.
    """

    async def reserve_tokens(self, key_id: str, tokens: int) -> None:
        """Charge `tokens` to the key, or raise SluiceError(RATE_LIMITED, retry_after_s=...) if they do not fit now."""
        ...

    def refund_tokens(self, key_id: str, tokens: int) -> None:
        """Give back a reservation whose request never ran. Never blocks or raises."""
        ...

    def commit_tokens(self, key_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Record a finished request's usage and charge its completion tokens. Never blocks or raises."""
        ...
