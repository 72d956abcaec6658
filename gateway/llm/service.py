"""The LLM layer's entry point: a protocol-neutral call in, a started `Dispatch` out.

Protocol edges (OpenAI routes, KServe generate over HTTP and gRPC) validate and
tokenize, build a `GenerateCall`, and call `LLMService.dispatch`. It knows no
protocol and raises only domain errors (`engines.errors.SluiceError`).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

from engines.base import EngineRequest, EngineStats
from engines.errors import ErrorKind, SluiceError
from gateway.llm.accounting import TokenQuota
from gateway.llm.admission import DEFAULT_CLAIM, AdmissionConfig, Asks, Claim, ClaimFor, open_claim
from gateway.llm.admission.deadlines import refuse_if_late
from gateway.llm.dispatch import Dispatch, start_dispatch
from gateway.llm.metrics import LLMMetrics
from gateway.llm.migration import MigrationConfig, Migrator
from gateway.llm.params import GenerationParams, check, sampling_for
from gateway.llm.registry import LLMModel, ModelRegistry
from gateway.llm.targets import LocalBackend, RouteHints, Target
from gateway.llm.tracing import RequestTrace, Tracing
from gateway.telemetry.context import RequestContext
from gateway.telemetry.context import current as current_request

# (key id, client cache_salt) -> the salt engine requests carry: the tenant's prefix-cache namespace.
SaltFor = Callable[[str | None, str | None], str | None]


@dataclass(frozen=True, slots=True)
class Prompt:
    token_ids: list[int]
    text: str | None = None  # what the client sent, when it sent text (echo)


@dataclass(frozen=True, slots=True)
class GenerateCall:
    """One API request in the LLM layer's terms: prompts × params.n engine requests."""

    model: LLMModel
    prompts: list[Prompt]
    params: GenerationParams
    request_id: str
    kind: Literal["chat", "completion"] = "completion"
    # The client's chat body, forwarded to remote workers so their own tool and
    # reasoning parsers apply; the validated sampling parameters are laid over it.
    chat_body: dict[str, Any] | None = None
    cache_salt: str | None = None  # the client's; the service derives the engine's (see LLMService)
    hints: RouteHints = field(default_factory=RouteHints)
    # The public id of the API key the edge authenticated: its token quota is charged.
    # None (no key involved): not metered.
    key_id: str | None = None
    # The edge takes runs of plain text as JSON (`EngineRequest.text_json`): streamed OpenAI responses.
    text_json: bool = False
    # What the request asked of the scheduler (X-Sluice-Priority, X-Sluice-TTFT-Deadline-Ms).
    asks: Asks = field(default_factory=Asks)
    # The HTTP request this call serves (its X-Request-Id and the caller's trace parent): by default the
    # one being handled (gateway.telemetry.context); None outside one (gRPC).
    context: RequestContext | None = field(default_factory=current_request)


class LLMService:
    def __init__(self, metrics: LLMMetrics, admission: AdmissionConfig | None = None, max_fanout: int = 128,
                 tokens: TokenQuota | None = None, tracing: Tracing | None = None,
                 salt_for: SaltFor | None = None, claim_for: ClaimFor | None = None,
                 migration: MigrationConfig | None = None) -> None:
        self.metrics = metrics
        # Streams of routed models whose worker is lost mid-answer resume elsewhere (None or a budget of 0: not).
        self.migration = migration if migration is not None and migration.max_migrations > 0 else None
        self.tracing = tracing or Tracing(None)
        self.registry = ModelRegistry(admission or AdmissionConfig())
        self.registry.on_change = metrics.model_changed
        self.registry.on_limits = metrics.limits_changed
        self.max_fanout = max_fanout  # engine requests one API request may create
        self.tokens = tokens
        # None: the client's salt as sent (tests, tools); the gateway passes its tenants' namespaces.
        self.salt_for = salt_for
        # (key id, asks) -> the request's tenant, weight, class and deadline; None: an open gateway's.
        self.claim_for = claim_for or open_claim
        self._live: weakref.WeakSet[Dispatch] = weakref.WeakSet()  # for interrupt_all; closed ones are skipped

    def get(self, name: str) -> LLMModel:
        return self.registry.get(name)

    async def dispatch(self, call: GenerateCall) -> Dispatch:
        """Validate; reserve the prompt tokens in the caller's token quota (the one
        `await`, which may reach Redis); then rank, admit, and tell the router at once
        which worker each engine request goes to. The router's contract is no `await`
        between rank and dispatch: concurrent requests must see each other's load and
        speculative cache entries. The caller must consume `Dispatch.deltas()` or call
        `Dispatch.close()`; closing commits the completion tokens to the quota."""
        check(call.model, call.params)
        self.check_fanout(len(call.prompts), call.params.n)
        claim = self.claim_for(call.key_id, call.asks)
        requests = self._engine_requests(call, claim)
        key_id, meter = call.key_id, self.tokens
        prompt_tokens = sum(len(p.token_ids) for p in call.prompts)
        if key_id is not None and meter is not None:
            await meter.reserve_tokens(key_id, prompt_tokens)
        ctx = call.context
        trace = self.tracing.begin(call.model.name, ctx.request_id if ctx else call.request_id, call.request_id,
                                   prompt_tokens, len(requests), ctx.parent if ctx else None)
        if ctx is not None and trace.trace_id is not None:
            ctx.trace_id = trace.trace_id  # the log lines that follow, the access line included, carry it
        d: Dispatch | None = None
        try:
            with trace.routing():
                ranked = [call.model.backend.rank(r, call.hints) for r in requests]
                trace.routed(ranked[0][0], len(requests))
            d = self._admit(call, claim, requests, ranked, prompt_tokens, trace)
            self._live.add(d)  # a drain's interrupt reaches it while it waits for its deadline too
            if not d.ticket.admitted and claim.deadline_s is not None:
                # Answer before any byte: a request that cannot start by its deadline gets the protocol's
                # overload status, not a stream that ends in an error event.
                await d.admitted()
        except BaseException as e:
            if d is not None:
                d.close()
            trace.end(e)
            if key_id is not None and meter is not None:
                meter.refund_tokens(key_id, prompt_tokens)  # refused before it ran (queue full, no worker)
            raise
        if key_id is not None and meter is not None:
            d.on_close = partial(meter.commit_tokens, key_id, prompt_tokens)
        return d

    def _admit(self, call: GenerateCall, claim: Claim, requests: list[EngineRequest], ranked: list[list[Target]],
               prompt_tokens: int, trace: RequestTrace) -> Dispatch:
        """Refuse a request its deadline cannot be met for, else take its ticket and open its attempts."""
        admission = call.model.admission
        predicted = refuse_if_late(admission, claim, len(requests), ranked[0])
        cap = call.params.max_tokens if call.params.max_tokens is not None else call.model.context_length
        answer = admission.expected_answer(claim.tenant, cap)
        ticket = admission.try_admit(len(requests), claim, tokens=prompt_tokens + len(requests) * answer,
                                     prompt_tokens=prompt_tokens)
        d = start_dispatch(self.metrics, call.model, requests, ranked, ticket, call.request_id, trace)
        d.predicted_ttft_s = predicted
        backend = call.model.backend
        if self.migration is not None and backend.shared:  # routed workers: there is another to resume on
            d.migrator = Migrator(self.migration, partial(backend.rank, hints=replace(call.hints, resume=True)),
                                  call.model.tokenizer)
        return d

    async def interrupt_all(self, error: SluiceError) -> int:
        """End every dispatch still running with `error` (a drain's deadline); returns how many."""
        live = [d for d in list(self._live) if not d.closed]
        await asyncio.gather(*(d.interrupt(error) for d in live))
        return len(live)

    def check_fanout(self, prompts: int, n: int) -> None:
        """One API request becomes prompts × n engine requests; each is a slot in the engine."""
        if prompts * n > self.max_fanout:
            raise SluiceError(f"this request asks for {prompts} prompts × n={n} = {prompts * n} generations; "
                              f"at most {self.max_fanout} are allowed per request", ErrorKind.INVALID_ARG,
                              param="n" if prompts == 1 else "prompt")

    def ready(self, strict: bool = True) -> bool:
        return self.registry.ready(strict)

    def engine_stats(self) -> list[tuple[str, str, EngineStats]]:
        """(model, worker, stats) of every in-process engine; remote workers report through the router."""
        return [(m.name, worker, e.stats()) for m in self.registry.models.values()
                if isinstance(m.backend, LocalBackend) for worker, e in m.backend.engines()]

    def _engine_requests(self, call: GenerateCall, claim: Claim = DEFAULT_CLAIM) -> list[EngineRequest]:
        out = []
        salt = self.salt_for(call.key_id, call.cache_salt) if self.salt_for is not None else call.cache_salt
        for p, prompt in enumerate(call.prompts):
            for i in range(call.params.n):
                sampling = sampling_for(call.model, call.params, len(prompt.token_ids), seed_offset=i)
                rid = f"{call.request_id}-{p}-{i}"
                out.append(EngineRequest(rid, call.model.name, prompt.token_ids, sampling, kind=call.kind,
                                         chat_body=call.chat_body, cache_salt=salt, text_json=call.text_json,
                                         api_request_id=call.context.request_id if call.context else None,
                                         priority=claim.engine_priority))
        return out
