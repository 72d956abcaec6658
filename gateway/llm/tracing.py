"""An optional OpenTelemetry trace per LLM request (`--otlp-endpoint URL`).

One trace per API request that reaches the LLM layer, or the caller's trace continued when the
request brought a valid W3C `traceparent` (`gateway.telemetry.context`): `llm.request` is then a
child of the caller's span, and the caller's `tracestate` travels on to the worker.

    llm.request        from `LLMService.dispatch` to `Dispatch.close` (model, request ids, tokens)
    ├── llm.route      ranking the workers of every engine request (policy reason, worker)
    ├── llm.admission  waiting for an admission ticket (max_running / max_queued)
    └── llm.engine     one per attempt (a failover adds one): worker, first token, finish reason;
                       a CLIENT span whose W3C `traceparent` goes to the worker in the request
                       headers (vLLM continues the trace when started with --otlp-traces-endpoint)

Spans are exported in batches over OTLP/HTTP protobuf by the OpenTelemetry SDK (its
`OTEL_*` variables apply: service name, sampler, batch delay). Each app has its own
TracerProvider, not the global one, so several apps in one process do not mix.

The hooks are a few calls in `gateway/llm/service.py` and `dispatch.py`. Spans are started
with an explicit parent and ended explicitly, never attached to the current context: the
engine span lives in an async generator that may be closed from another task (a client that
disconnects), where a context token could not be detached. With tracing off every hook is a
no-op on `NO_TRACE`, except that a caller's trace context is passed on to the worker unchanged
(`_PassThrough`), so the worker's spans still join the caller's trace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

from engines.base import Delta, EngineRequest
from gateway.telemetry.context import TraceParent

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from gateway.llm.targets import Target


class RequestTrace:
    """The spans of one request; this base class is the no-op used when tracing is off."""

    @property
    def trace_id(self) -> str | None:
        """The request's trace (32 hex digits), when it has one."""
        return None

    @property
    def sampled(self) -> bool:
        """Whether the trace is recorded (by this gateway, or by the caller that sampled it)."""
        return False

    def routing(self) -> Any:
        """A context manager around ranking."""
        return _NULL

    def routed(self, target: Target, choices: int) -> None:
        """Inside `routing()`, once ranking succeeded: the first choice's best target."""

    def admission(self) -> Any:
        """A context manager around the wait for the admission ticket."""
        return _NULL

    def engine_call(self, target: Target, request: EngineRequest) -> Any:
        """An async context manager around one attempt on `target`: it gives an `EngineCall`, whose
        `request` is what to send (with trace headers when tracing)."""
        return EngineCall(request)

    def end(self, error: BaseException | None = None) -> None:
        """The request is over (idempotent); `error` if it failed before it could run."""


class EngineCall:
    """One attempt: the request to send, and `observe(delta)` for every delta it yields.
    Untraced, it is its own (no-op) context manager, so an attempt allocates one object."""

    __slots__ = ("request",)

    def __init__(self, request: EngineRequest) -> None:
        self.request = request

    async def __aenter__(self) -> EngineCall:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def observe(self, delta: Delta) -> None:
        pass


class _NullContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _NullContext()
NO_TRACE = RequestTrace()


class Tracing:
    """Starts request traces; `Tracing(None)` is off and returns `NO_TRACE`."""

    def __init__(self, endpoint: str | None, service_version: str = "") -> None:
        self._provider: TracerProvider | None = None
        self._tracer: Tracer | None = None
        if endpoint:
            self._provider = _provider(endpoint, service_version)
            self._tracer = self._provider.get_tracer("sluice.gateway", service_version)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def begin(self, model: str, request_id: str, response_id: str, prompt_tokens: int, choices: int,
              parent: TraceParent | None = None) -> RequestTrace:
        """`request_id` is the request's X-Request-Id, `response_id` the body's `id`; `parent` the caller's."""
        if self._tracer is None:
            return NO_TRACE if parent is None else _PassThrough(parent)
        return _LiveTrace(self._tracer, parent, model=model, request_id=request_id, response_id=response_id,
                          prompt_tokens=prompt_tokens, choices=choices)

    def shutdown(self) -> None:
        """Flush what is buffered and stop the exporter (at server shutdown)."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = self._tracer = None


def _provider(endpoint: str, version: str) -> TracerProvider:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        raise ValueError(f"--otlp-endpoint needs the OpenTelemetry SDK and its OTLP/HTTP exporter "
                         f"(pip install 'sluice-gateway[tracing]'): {e}") from None

    attributes = {"service.version": version}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "sluice-gateway"
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


class _PassThrough(RequestTrace):
    """Tracing off, and the caller sent a trace context: the worker gets it unchanged."""

    def __init__(self, parent: TraceParent) -> None:
        self._parent = parent

    @property
    def trace_id(self) -> str | None:
        return self._parent.trace_id

    @property
    def sampled(self) -> bool:
        return bool(self._parent.flags & 0x01)

    def engine_call(self, target: Target, request: EngineRequest) -> Any:
        return EngineCall(dataclasses.replace(request, trace_headers=self._parent.headers()))


class _LiveTrace(RequestTrace):
    def __init__(self, tracer: Tracer, parent: TraceParent | None, *, model: str, request_id: str,
                 response_id: str, prompt_tokens: int, choices: int) -> None:
        from opentelemetry import trace

        self._tracer = tracer
        self._root = tracer.start_span("llm.request", context=_remote(parent), kind=trace.SpanKind.SERVER, attributes={
            "gen_ai.request.model": model, "sluice.request_id": request_id, "gen_ai.response.id": response_id,
            "gen_ai.usage.input_tokens": prompt_tokens, "sluice.choices": choices})
        self._route: Span | None = None
        self._ended = False

    @property
    def trace_id(self) -> str | None:
        return format(self._root.get_span_context().trace_id, "032x")

    @property
    def sampled(self) -> bool:
        return bool(self._root.get_span_context().trace_flags.sampled)

    def _child(self, name: str, **kwargs: Any) -> Span:
        from opentelemetry import trace

        return self._tracer.start_span(name, context=trace.set_span_in_context(self._root), **kwargs)

    @contextmanager
    def routing(self) -> Iterator[None]:
        with _ended(self._child("llm.route")) as span:
            self._route = span
            yield

    def routed(self, target: Target, choices: int) -> None:
        self._root.set_attribute("sluice.worker", target.name)
        attributes: dict[str, str | int] = {"sluice.worker": target.name, "sluice.route.reason": target.reason or "",
                      "sluice.route.predicted_cached_tokens": target.predicted_cached_tokens or 0,
                      "sluice.choices": choices}
        if self._route is not None:
            self._route.set_attributes(attributes)

    @contextmanager
    def admission(self) -> Iterator[None]:
        with _ended(self._child("llm.admission")):
            yield

    @asynccontextmanager
    async def engine_call(self, target: Target, request: EngineRequest) -> AsyncIterator[EngineCall]:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        with _ended(self._child("llm.engine", kind=trace.SpanKind.CLIENT, attributes={
                "sluice.worker": target.name, "sluice.engine_request_id": request.request_id})) as span:
            headers: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(headers, context=trace.set_span_in_context(span))
            yield _TracedCall(dataclasses.replace(request, trace_headers=headers), span)

    def end(self, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        if error is not None:
            _record(self._root, error)
        self._root.end()


class _TracedCall(EngineCall):
    __slots__ = ("_first", "_span")

    def __init__(self, request: EngineRequest, span: Span) -> None:
        super().__init__(request)
        self._span, self._first = span, True

    def observe(self, delta: Delta) -> None:
        if self._first and (delta.text or delta.token_ids or delta.text_json is not None
                            or delta.finish_reason is not None):
            self._first = False
            self._span.add_event("first_token")
        if delta.finish_reason is not None:
            self._span.set_attributes({"gen_ai.response.finish_reasons": [delta.finish_reason],
                                       "gen_ai.usage.output_tokens": delta.completion_tokens,
                                       "sluice.cached_tokens": delta.cached_tokens or 0})
            if delta.finish_reason == "error":
                from opentelemetry.trace import Status, StatusCode

                self._span.set_status(Status(StatusCode.ERROR, delta.error or "engine error"))


@contextmanager
def _ended(span: Span) -> Iterator[Span]:
    """End `span` on the way out; an exception (other than a closed generator) marks it failed."""
    try:
        yield span
    except (GeneratorExit, asyncio.CancelledError):
        span.set_attribute("sluice.abandoned", True)  # the client left; not a failure of this step
        raise
    except BaseException as e:
        _record(span, e)
        raise
    finally:
        span.end()


def _remote(parent: TraceParent | None) -> Any:
    """The OpenTelemetry context whose current span is the caller's (None: a new trace)."""
    if parent is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    state = TraceState.from_header([parent.tracestate]) if parent.tracestate else None
    caller = SpanContext(int(parent.trace_id, 16), int(parent.span_id, 16), is_remote=True,
                         trace_flags=TraceFlags(parent.flags), trace_state=state)
    return trace.set_span_in_context(NonRecordingSpan(caller))


def _record(span: Span, error: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, getattr(error, "message", None) or type(error).__name__))
