"""The LLM side of the gateway: models, tokenization, admission and dispatch.

Routes call this module; it knows nothing about HTTP. A model has a tokenizer
(the model's own), a context length, an admission controller and a `Backend`
that ranks the engines able to serve a request: one in-process engine, or
remote workers ranked by the router.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from engines.base import Delta, EngineError, EngineRequest, SamplingParams
from engines.errors import ErrorKind
from engines.tokenizer import ChatTokenizer
from gateway.admission import Admission, AdmissionConfig, QueueFull, Ticket
from gateway.backends import Backend, RouteHints, Target
from gateway.errors import OpenAIError, model_not_found
from gateway.metrics import LLMMetrics


@dataclass(slots=True)
class LLMModel:
    name: str
    tokenizer: ChatTokenizer
    context_length: int
    backend: Backend
    admission: Admission
    owned_by: str = "sluice"
    root: str | None = None  # local weights directory, reported like vLLM's `root`
    created: int = field(default_factory=lambda: int(time.time()))


class LLMService:
    def __init__(self, metrics: LLMMetrics, admission: AdmissionConfig | None = None) -> None:
        self.metrics = metrics
        self.admission_config = admission or AdmissionConfig()
        self.models: dict[str, LLMModel] = {}
        self.pending: set[str] = set()  # models still loading: 503, not 404

    # -- registry ----------------------------------------------------------
    def add_model(self, name: str, tokenizer: ChatTokenizer, context_length: int, backend: Backend) -> LLMModel:
        model = LLMModel(name, tokenizer, context_length, backend, Admission(self.admission_config))
        self.models[name] = model
        return model

    def has_model(self, name: str) -> bool:
        return name in self.models

    def model_names(self) -> list[str]:
        return sorted(self.models)

    def get(self, name: str) -> LLMModel:
        model = self.models.get(name)
        if model is None:
            if name in self.pending:
                raise OpenAIError(503, f"The model `{name}` is still loading.", code="model_loading",
                                  err_type="server_error", headers={"Retry-After": "5"})
            raise model_not_found(name)
        return model

    def ready(self) -> bool:
        return all(m.backend.ready() for m in self.models.values())

    def engine_stats(self) -> list[tuple[str, Any]]:
        return [(m.name, e.stats()) for m in self.models.values() for _, e in m.backend.engines()]

    # -- request preparation -------------------------------------------------
    def sampling(self, model: LLMModel, body: Any, prompt_len: int, *, seed_offset: int = 0) -> SamplingParams:
        """SamplingParams from an OpenAI body, with the context-length check."""
        room = model.context_length - prompt_len
        if room <= 0:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {model.context_length} tokens. However, your "
                f"prompt has {prompt_len} tokens.",
                code="context_length_exceeded", param="messages",
            )
        max_tokens = body.max_tokens if body.max_tokens is not None else room
        if prompt_len + max_tokens > model.context_length:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {model.context_length} tokens. However, you "
                f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for "
                f"the completion). Please reduce the prompt or max_tokens.",
                code="context_length_exceeded", param="max_tokens",
            )
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        temperature = 1.0 if body.temperature is None else body.temperature
        logprobs = _requested_logprobs(body)
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=1.0 if body.top_p is None else body.top_p,
                top_k=-1 if body.top_k is None else body.top_k,
                min_p=body.min_p,
                seed=None if body.seed is None else body.seed + seed_offset,
                stop=stop,
                stop_token_ids=tuple(body.stop_token_ids or ()),
                ignore_eos=body.ignore_eos,
                min_tokens=body.min_tokens,
                repetition_penalty=body.repetition_penalty,
                presence_penalty=body.presence_penalty,
                frequency_penalty=body.frequency_penalty,
                logprobs=logprobs,
                include_stop_str_in_output=body.include_stop_str_in_output,
            )
        except ValueError as e:
            raise OpenAIError(400, str(e)) from None

    def admit(self, model: LLMModel) -> Ticket:
        try:
            ticket = model.admission.try_admit()
        except QueueFull as e:
            raise OpenAIError(
                503, f"The server is overloaded ({e}); retry later.", code="queue_full",
                err_type="server_error", headers={"Retry-After": "1"},
            ) from None
        self._gauge(model)
        return ticket

    def _gauge(self, model: LLMModel) -> None:
        self.metrics.inflight.labels(model.name).set(model.admission.running)
        self.metrics.queued.labels(model.name).set(model.admission.queued)

    # -- dispatch ------------------------------------------------------------
    def targets(self, model: LLMModel, request: EngineRequest, hints: RouteHints) -> list[Target]:
        targets = model.backend.rank(request, hints)
        if not targets:
            raise OpenAIError(503, f"no healthy worker serves model `{model.name}`", code="no_worker",
                              err_type="server_error", headers={"Retry-After": "1"})
        return targets

    async def wait_admitted(self, model: LLMModel, ticket: Ticket) -> None:
        """Wait until the ticket holds a running slot; records the queue time."""
        t0 = time.monotonic()
        await ticket.wait()
        self._gauge(model)
        self.metrics.queue_time.labels(model.name).observe(time.monotonic() - t0)

    def release(self, model: LLMModel, ticket: Ticket) -> None:
        ticket.release()
        self._gauge(model)

    async def run(self, model: LLMModel, request: EngineRequest, targets: list[Target]) -> AsyncIterator[Delta]:
        """Stream one generation (the caller holds an admission ticket): try targets
        in rank order until one starts, record metrics. Errors after the first delta
        arrive as a final Delta(finish_reason="error")."""
        m = self.metrics
        t0 = time.monotonic()
        try:
            last_err: EngineError | None = None
            for target in targets:
                started = False
                try:
                    async with aclosing(self._run_target(model, request, target, t0)) as stream:
                        async for delta in stream:
                            started = True
                            yield delta
                    return
                except EngineError as e:
                    if started or not e.retryable:
                        raise
                    last_err = e
                    if target is not targets[-1]:
                        m.retries.labels(model.name).inc()
            assert last_err is not None
            raise last_err
        finally:
            m.e2e.labels(model.name).observe(time.monotonic() - t0)

    async def _run_target(self, model: LLMModel, request: EngineRequest, target: Target, t0: float
                          ) -> AsyncIterator[Delta]:
        target.start()
        clock = _StreamClock(self.metrics, model.name, t0, target)
        # Only worker faults count against a worker (circuit breaker), not a
        # client that went away or a request the engine refused as invalid.
        failed = True
        try:
            async with aclosing(target.engine.generate(request)) as stream:
                async for delta in stream:
                    clock.tick(delta)
                    if delta.finish_reason is not None:
                        failed = delta.finish_reason == "error"
                        self._account(model, request, delta)
                    yield delta
        except EngineError as e:
            failed = e.worker_fault
            raise
        except (asyncio.CancelledError, GeneratorExit):
            failed = False
            raise
        finally:
            target.finish(clock.reported_cached, failed)

    def _account(self, model: LLMModel, request: EngineRequest, last: Delta) -> None:
        m = self.metrics
        m.prompt_tokens.labels(model.name).inc(last.prompt_tokens or len(request.prompt_token_ids))
        m.generation_tokens.labels(model.name).inc(last.completion_tokens)
        if last.cached_tokens:
            m.cached_tokens.labels(model.name).inc(last.cached_tokens)
        m.finished.labels(model.name, last.finish_reason or "unknown").inc()

    # -- KServe generate -------------------------------------------------------
    async def generate_text(self, model_name: str, prompt: str, params: dict[str, Any]) -> AsyncIterator[Delta]:
        """Text in, deltas out: the KServe v2 `generate` extension."""
        try:
            model = self.get(model_name)
        except OpenAIError as e:
            raise EngineError(e.message, ErrorKind.NOT_FOUND) from None
        ids = model.tokenizer.encode(prompt)
        body = _ParamsBody(params)
        try:
            sampling = self.sampling(model, body, len(ids))
        except OpenAIError as e:
            raise EngineError(e.message, ErrorKind.CONTEXT_TOO_LONG if e.code == 'context_length_exceeded' else ErrorKind.INVALID_ARG, code=e.code) from None
        req = EngineRequest(f"gen-{uuid.uuid4().hex}", model.name, ids, sampling, prompt_text=prompt)
        try:
            ticket = self.admit(model)
        except OpenAIError as e:
            raise EngineError(e.message, ErrorKind.OVERLOADED, retryable=True) from None
        try:
            await self.wait_admitted(model, ticket)
            async with aclosing(self.run(model, req, self.targets(model, req, RouteHints()))) as stream:
                async for delta in stream:
                    yield delta
        finally:
            self.release(model, ticket)


class _StreamClock:
    """Per-stream timing: TTFT on the first delta, inter-token latency after."""

    def __init__(self, metrics: LLMMetrics, model: str, t0: float, target: Target) -> None:
        self.m, self.model, self.last_t, self.target = metrics, model, t0, target
        self.t0 = t0
        self.first = True
        self.reported_cached: int | None = None

    def tick(self, delta: Delta) -> None:
        now = time.monotonic()
        visible = bool(delta.text or delta.token_ids or delta.chat_extra)
        if self.first and (visible or delta.finish_reason):
            self.m.ttft.labels(self.model).observe(now - self.t0)
            if self.target.on_first_token:
                self.target.on_first_token()
            self.first = False
        elif visible:
            self.m.itl.labels(self.model).observe(now - self.last_t)
        self.last_t = now
        if delta.cached_tokens is not None:
            self.reported_cached = delta.cached_tokens


def _requested_logprobs(body: Any) -> int | None:
    lp = getattr(body, "logprobs", None)
    if lp is True:  # chat: logprobs=true, top_logprobs=k
        return int(getattr(body, "top_logprobs", None) or 0)
    if lp is False or lp is None:
        return None
    return int(lp)  # completions: logprobs=k


class _ParamsBody:
    """KServe generate parameters viewed like an OpenAI body for `sampling()`."""

    _FIELDS = {
        "max_tokens": None, "temperature": None, "top_p": None, "top_k": None, "min_p": 0.0, "seed": None,
        "stop": None, "stop_token_ids": None, "ignore_eos": False, "min_tokens": 0,
        "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "logprobs": None,
        "include_stop_str_in_output": False,
    }

    def __init__(self, params: dict[str, Any]) -> None:
        for key, default in self._FIELDS.items():
            setattr(self, key, params.get(key, default))
        if self.max_tokens is None and "max_new_tokens" in params:
            self.max_tokens = params["max_new_tokens"]
        for key in ("max_tokens", "top_k", "seed", "min_tokens"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise EngineError(f"parameter '{key}' must be an integer", ErrorKind.INVALID_ARG)
        if self.max_tokens is not None and self.max_tokens < 0:
            raise EngineError("parameter 'max_tokens' must be >= 0", ErrorKind.INVALID_ARG)
