"""Dispatch: one admitted, routed API request, from the routing decision to the last delta.

A `Dispatch` holds the engine requests one API request became (prompts × n), the
ranked targets of each, and its admission ticket. It alone owns every target's
lifecycle: an attempt is opened (the router's `on_dispatch`) when its target is
chosen and closed (`on_finish`) exactly once, whether it streamed to the end,
failed over, or the client left before it ran. `close()` is idempotent and every
protocol edge calls it when its response ends. `interrupt(error)` ends a dispatch
from outside (a drain that reached its deadline): its consumer raises `error` at its
next step, which a stream turns into an error event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace

from engines.base import Delta, EngineRequest
from engines.errors import SluiceError
from gateway.llm.accounting import StreamClock, account_finished, gauge_admission
from gateway.llm.admission import Ticket
from gateway.llm.fanout import merge
from gateway.llm.metrics import LLMMetrics
from gateway.llm.migration import Migrator, Resumed, Sent
from gateway.llm.registry import LLMModel
from gateway.llm.targets import Target
from gateway.llm.tracing import NO_TRACE, RequestTrace


@dataclass(slots=True)
class Choice:
    """One engine request of a dispatch (a prompt × one of n) and its attempts."""

    request: EngineRequest  # what the current attempt runs (after a migration: the resume)
    targets: list[Target]  # ranked, best first; never empty (once it answered: the first and the current)
    current: int = 0  # the target of the open (or last) attempt
    open: bool = False  # the current attempt was dispatched and not yet finished
    # Tokens generated so far: the engine's count once it reports one, else counted from
    # the deltas, so a stream the client left early is still charged for what it used.
    completion_tokens: int = 0
    sent: Sent = field(default_factory=Sent)  # what the client has (kept only when streams may migrate)
    origin: EngineRequest | None = None  # the request as the client made it, once it was resumed
    resumed: Resumed | None = None  # the current attempt resumes the answer after this many tokens
    lost: set[str] = field(default_factory=set)  # workers lost mid-answer: no resume goes there


@dataclass(slots=True, weakref_slot=True, eq=False)  # identity: kept in a WeakSet
class Dispatch:
    metrics: LLMMetrics
    model: LLMModel
    choices: list[Choice]
    ticket: Ticket
    request_id: str
    created: int = field(default_factory=lambda: int(time.time()))
    # Called once by close() with the completion tokens of all choices (per-key token quotas).
    on_close: Callable[[int], None] | None = None
    trace: RequestTrace = NO_TRACE  # OpenTelemetry spans of this request (gateway.llm.tracing), if tracing
    # The latency histograms' exemplar: the request's trace, when one is recorded (OpenMetrics scrapes).
    exemplar: dict[str, str] | None = None
    # With a TTFT deadline: the predicted time to first token it was admitted on (X-Sluice-Predicted-TTFT-Ms).
    predicted_ttft_s: float | None = None
    # Resumes a stream whose worker was lost mid-answer on another (gateway.llm.migration); None: it ends.
    migrator: Migrator | None = None
    _closed: bool = False
    _interrupted: SluiceError | None = None
    _wake: asyncio.Event | None = None  # set by interrupt(); made only while waiting for admission

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def requests(self) -> list[EngineRequest]:
        return [c.request for c in self.choices]

    @property
    def worker(self) -> str:
        """The worker of the first choice's current (or last) attempt."""
        first = self.choices[0]
        return first.targets[first.current].name

    def headers(self) -> dict[str, str]:
        """Routing headers of the first choice. A streaming response sends them before
        generation starts, so after a failover they name the first-ranked worker; a
        non-streaming response builds them at the end and names the one that served.
        (X-Request-Id is the middleware's, on every response.)"""
        h = {"X-Sluice-Worker": self.worker}
        first = self.choices[0].targets[0]
        # Lets clients compare the router's prediction with the engine's
        # usage.prompt_tokens_details.cached_tokens, request by request.
        if first.predicted_cached_tokens is not None:
            h["X-Sluice-Predicted-Cached-Tokens"] = str(first.predicted_cached_tokens)
        if first.reason is not None:
            h["X-Sluice-Route-Reason"] = first.reason
        if self.predicted_ttft_s is not None:
            h["X-Sluice-Predicted-TTFT-Ms"] = str(round(1000 * self.predicted_ttft_s))
        return h

    def open_first_attempts(self) -> None:
        """Tell the router which worker each choice goes to; called with no `await`
        since ranking, so concurrent requests see each other's load."""
        for choice in self.choices:
            self.open_attempt(choice)

    async def deltas(self) -> AsyncGenerator[tuple[int, Delta], None]:
        """All choices' deltas, tagged with the choice index; closes the dispatch at the end.

        A failure before a choice's first delta moves it to its next-ranked target when
        the error is retryable; after that, errors arrive as a final Delta(finish_reason="error")."""
        try:
            t0 = time.monotonic()
            with self.trace.admission():
                await self.admitted()
            gauge_admission(self.metrics, self.model)
            self.metrics.queue_time.labels(self.model.name).observe(time.monotonic() - t0, self.exemplar)
            async with aclosing(merge([self._run(c) for c in self.choices])) as merged:
                async for item in merged:
                    if self._interrupted is not None:
                        raise self._interrupted  # instead of what the aborted engines sent last
                    yield item
        finally:
            self.close()

    async def admitted(self) -> None:
        """Wait for the admission ticket, unless interrupted first; raises why it was not admitted."""
        if not self.ticket.admitted and self._interrupted is None:
            self._wake = asyncio.Event()
            waits = [asyncio.ensure_future(self.ticket.wait()), asyncio.ensure_future(self._wake.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        if self._interrupted is not None:
            raise self._interrupted
        if self.ticket.error is not None:
            raise self.ticket.error  # it left the queue: its deadline passed, or it was pushed out

    async def interrupt(self, error: SluiceError) -> None:
        """End this dispatch with `error`: the engine requests are aborted, and the consumer
        raises `error` instead of the deltas that follow. No-op once closed."""
        if self._closed or self._interrupted is not None:
            return
        self._interrupted = error
        if self._wake is not None:
            self._wake.set()
        aborts = [c.targets[c.current].engine.abort(c.request.request_id) for c in self.choices if c.open]
        await asyncio.gather(*aborts, return_exceptions=True)

    def close(self) -> None:
        """Finish every attempt still open (the client left before it ran) and free the ticket."""
        for choice in self.choices:
            self._finish(choice, None, fault=False)
        if not self._closed:
            self._closed = True
            self.ticket.release(sum(c.completion_tokens for c in self.choices))
            gauge_admission(self.metrics, self.model)
            if self.on_close is not None:
                self.on_close(sum(c.completion_tokens for c in self.choices))
            self.trace.end()

    # -- one choice ------------------------------------------------------------
    async def _run(self, choice: Choice) -> AsyncGenerator[Delta, None]:
        t0 = time.monotonic()
        migrator = self.migrator
        try:
            while True:
                started = False
                lost: Delta | SluiceError | None = None  # how a worker lost mid-answer ended its attempt
                try:
                    async with aclosing(self._attempt(choice, t0)) as stream:
                        async for delta in stream:
                            if delta.fault is not None and migrator is not None:
                                lost = delta
                                break
                            if delta.fault is not None:
                                account_finished(self.metrics, self.model.name, choice.origin or choice.request, delta)
                            started = True
                            if migrator is not None:
                                choice.sent.add(delta, time.monotonic())
                            yield delta
                    if lost is None:
                        return
                except SluiceError as e:
                    if not started and e.retryable and choice.current + 1 < len(choice.targets):
                        self.metrics.retries.labels(self.model.name).inc()
                        choice.current += 1
                        self.open_attempt(choice)
                        continue
                    if migrator is None or not choice.sent.any or not e.worker_fault:
                        raise
                    lost = e
                assert migrator is not None and lost is not None
                if self._interrupted is not None:  # a drain's deadline came meanwhile: no new attempt
                    raise self._interrupted
                out, then = migrator.resume(self.metrics, self.model.name, choice, lost,
                                            seen_lost=started or isinstance(lost, Delta))
                if then == "attempt":
                    self.open_attempt(choice)
                for delta in out:
                    yield delta
                if then == "fail" and isinstance(lost, SluiceError):
                    raise lost
                if then != "attempt":
                    return
        finally:
            self.metrics.e2e.labels(self.model.name).observe(time.monotonic() - t0, self.exemplar)

    async def _attempt(self, choice: Choice, t0: float) -> AsyncGenerator[Delta, None]:
        target = choice.targets[choice.current]
        resumed = choice.resumed
        clock = StreamClock(self.metrics, self.model.name, t0, self.exemplar, ttft=resumed is None)
        # Only worker faults count against a worker (circuit breaker): not a client
        # that went away, nor a request the engine rightly refused.
        fault = False
        answered: int | None = None  # tokens of an answer that ran to its end (stop or length)
        settled = False
        try:
            async with self.trace.engine_call(target, choice.request) as call, \
                    aclosing(target.engine.generate(call.request)) as stream:
                async for delta in stream:
                    if not settled:
                        settled, target = True, _settle(choice)
                    if resumed is not None:
                        delta = resumed.adjust(delta)
                    call.observe(delta)
                    _count_tokens(choice, delta)
                    if clock.tick(delta):
                        self.ticket.first_token()
                        if target.on_first_token is not None:
                            target.on_first_token()
                        if resumed is not None:
                            self.metrics.migration_pause.labels(self.model.name).observe(
                                time.monotonic() - choice.sent.last_at)
                    if delta.finish_reason is not None:
                        fault = delta.finish_reason == "error"
                        if delta.finish_reason in ("stop", "length", "tool_calls"):
                            answered = choice.completion_tokens
                        if delta.fault is None:  # a lost worker's: accounted if it reaches the client
                            account_finished(self.metrics, self.model.name, choice.origin or choice.request, delta)
                    yield delta
        except SluiceError as e:
            fault = e.worker_fault
            raise
        finally:
            self._finish(choice, clock.reported_cached, fault, answered)

    def open_attempt(self, choice: Choice) -> None:
        choice.open = True
        hook = choice.targets[choice.current].on_dispatch
        if hook is not None:
            hook()

    def _finish(self, choice: Choice, cached_tokens: int | None, fault: bool,
                answered: int | None = None) -> None:
        if not choice.open:
            return
        choice.open = False
        hook = choice.targets[choice.current].on_finish
        if hook is not None:
            hook(cached_tokens, fault, answered)


def _settle(choice: Choice) -> Target:
    """The current attempt answered, so no other target will be tried: keep only the first-ranked
    one (the headers carry its prediction) and the current one, both without their dispatch hook
    (already called), which holds the router's whole ranking. A long stream then holds one or two
    targets, not one per worker of the fleet. Returns the current target."""
    first, current = choice.targets[0], choice.targets[choice.current]
    kept = [replace(first, on_dispatch=None)]
    if choice.current:
        kept.append(replace(current, on_dispatch=None))
    choice.targets, choice.current = kept, len(kept) - 1
    return kept[-1]


def _count_tokens(choice: Choice, delta: Delta) -> None:
    if delta.finish_reason is not None and delta.completion_tokens:
        choice.completion_tokens = delta.completion_tokens  # the engine's own count is exact
    else:
        seen = choice.completion_tokens + (len(delta.token_ids) or int(bool(delta.text)))
        choice.completion_tokens = max(delta.completion_tokens, seen)


def start_dispatch(metrics: LLMMetrics, model: LLMModel, requests: list[EngineRequest],
                   ranked: list[list[Target]], ticket: Ticket, request_id: str,
                   trace: RequestTrace = NO_TRACE) -> Dispatch:
    d = Dispatch(metrics, model, [Choice(r, t) for r, t in zip(requests, ranked, strict=True)], ticket,
                 request_id, trace=trace)
    if trace.sampled and trace.trace_id is not None:
        d.exemplar = {"trace_id": trace.trace_id}
    d.open_first_attempts()
    gauge_admission(metrics, model)
    return d
