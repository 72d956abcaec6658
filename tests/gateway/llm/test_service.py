"""LLMService.dispatch in-process: validation, the token quota's reserve / refund / commit
contract (gateway.llm.accounting.TokenQuota), admission, and failover through a backend."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from engines.base import Delta
from engines.errors import ErrorKind, SluiceError
from gateway.llm.admission import AdmissionConfig
from gateway.llm.metrics import LLMMetrics
from gateway.llm.params import GenerationParams
from gateway.llm.service import GenerateCall, LLMService, Prompt
from gateway.telemetry import context
from tests.gateway.llm.fakes import (
    HANG,
    FakeBackend,
    FakeEngine,
    FakeQuota,
    FakeTokenizer,
    Hooks,
    drain,
    retryable,
    tokens,
)

_STUCK_S = 5.0  # bounds a wait that should already be over, so a regression fails instead of hanging
PROMPT = [1, 2, 3, 4]


@dataclass
class World:
    """A service with one model `m` served by `engines` (ranked in that order) and a recording quota."""

    engines: list[FakeEngine]
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    log: list[str] = field(default_factory=list)  # reserve / rank / refund / commit, in call order
    hooks: Hooks = field(default_factory=Hooks)

    def __post_init__(self) -> None:
        self.registry = CollectorRegistry()
        self.quota = FakeQuota(self.log)
        self.backend = FakeBackend(self.hooks, self.engines, self.log)
        self.service = LLMService(LLMMetrics(self.registry), self.admission, tokens=self.quota)
        self.model = self.service.registry.add("m", FakeTokenizer(), 4096, self.backend)

    def call(self, *prompts: list[int], key_id: str | None = "k", n: int = 1, **params: object) -> GenerateCall:
        return GenerateCall(self.model, [Prompt(p) for p in prompts or [PROMPT]],
                            GenerationParams(max_tokens=16, n=n, **params),
                            "req", key_id=key_id)


async def test_reserve_comes_before_ranking_and_commit_once_at_the_end() -> None:
    w = World([FakeEngine("w1", tokens("a", "b"))])
    d = await w.service.dispatch(w.call())
    assert w.log == ["reserve", "rank"]
    assert w.quota.reserved == [("k", len(PROMPT))]
    text, _ = await drain(d)
    d.close()  # the protocol edge closes again; the quota is charged once
    assert text == "ab"
    assert w.log == ["reserve", "rank", "commit"]
    assert w.quota.committed == [("k", len(PROMPT), 2)]
    assert w.quota.refunded == []
    assert w.engines[0].requests == ["req-0-0"]


async def test_commit_charges_what_a_client_that_left_used() -> None:
    w = World([FakeEngine("w1", [Delta(text="a", token_ids=[5]), Delta(text="b", token_ids=[6]), HANG])])
    d = await w.service.dispatch(w.call())
    stream = d.deltas()
    await anext(stream)
    await anext(stream)
    await stream.aclose()
    assert w.quota.committed == [("k", len(PROMPT), 2)]


async def test_commit_once_for_all_choices_of_all_prompts() -> None:
    w = World([FakeEngine("w1", tokens("a", "b", "c"))])
    d = await w.service.dispatch(w.call([1, 2, 3], [4, 5, 6, 7, 8], n=2))
    await drain(d)
    assert sorted(w.engines[0].requests) == ["req-0-0", "req-0-1", "req-1-0", "req-1-1"]
    assert w.quota.reserved == [("k", 8)]  # prompt tokens count once per prompt, not per choice
    assert w.quota.committed == [("k", 8, 4 * 3)]


async def test_engine_error_after_first_delta_still_commits_once() -> None:
    w = World([FakeEngine("w1", [Delta(text="a", token_ids=[5]), retryable("broken stream")])])
    d = await w.service.dispatch(w.call())
    with pytest.raises(SluiceError, match="broken stream"):
        await drain(d)
    assert w.quota.committed == [("k", len(PROMPT), 1)]
    assert w.quota.refunded == []


async def test_refund_when_admission_is_full() -> None:
    w = World([FakeEngine("w1", [HANG])], admission=AdmissionConfig(max_running=1, max_queued=0))
    running = await w.service.dispatch(w.call())
    with pytest.raises(SluiceError) as refused:
        await w.service.dispatch(w.call())
    assert refused.value.kind is ErrorKind.OVERLOADED and refused.value.code == "queue_full"
    assert w.quota.refunded == [("k", len(PROMPT))]
    assert w.quota.committed == []
    assert w.hooks.of("dispatch") == ["w1"]  # the refused request never reached the router
    running.close()
    assert w.quota.committed == [("k", len(PROMPT), 0)]
    assert w.log == ["reserve", "rank", "reserve", "rank", "refund", "commit"]


async def test_refund_when_no_worker_serves_the_model() -> None:
    w = World([FakeEngine("w1", tokens("a"))])
    w.backend.error = SluiceError("no healthy worker serves model `m`", ErrorKind.NO_WORKER, retry_after_s=1.0)
    with pytest.raises(SluiceError) as refused:
        await w.service.dispatch(w.call())
    assert refused.value.kind is ErrorKind.NO_WORKER
    assert w.log == ["reserve", "rank", "refund"]
    assert w.quota.refunded == [("k", len(PROMPT))]
    assert w.model.admission.running == 0


async def test_a_spent_quota_refuses_before_ranking() -> None:
    w = World([FakeEngine("w1", tokens("a"))])
    w.quota.refuse = SluiceError("token quota spent", ErrorKind.RATE_LIMITED, retry_after_s=3.0)
    with pytest.raises(SluiceError) as refused:
        await w.service.dispatch(w.call())
    assert refused.value.kind is ErrorKind.RATE_LIMITED
    assert w.log == ["reserve"]  # nothing reserved, so nothing to refund
    assert w.model.admission.running == 0


async def test_invalid_parameters_are_refused_before_reserving() -> None:
    w = World([FakeEngine("w1", tokens("a"))])
    with pytest.raises(SluiceError) as refused:
        await w.service.dispatch(w.call(temperature=3.0))
    assert refused.value.kind is ErrorKind.INVALID_ARG and refused.value.param == "temperature"
    assert w.log == []


async def test_a_request_without_a_key_is_not_metered() -> None:
    w = World([FakeEngine("w1", tokens("a"))])
    d = await w.service.dispatch(w.call(key_id=None))
    await drain(d)
    assert w.log == ["rank"]


async def test_failover_through_the_service() -> None:
    w = World([FakeEngine("w1", [retryable()]), FakeEngine("w2", tokens("from", " w2"))])
    d = await w.service.dispatch(w.call())
    text, _ = await drain(d)
    assert text == "from w2"
    assert w.registry.get_sample_value("sluice_request_retries_total", {"model": "m"}) == 1
    assert w.quota.committed == [("k", len(PROMPT), 2)]
    assert [c[:2] for c in w.hooks.finishes()] == [("finish", "w1"), ("finish", "w2")]


async def test_interrupt_all_ends_only_live_dispatches() -> None:
    w = World([FakeEngine("w1", [Delta(text="a", token_ids=[5]), HANG])])
    done = await w.service.dispatch(w.call())
    done.close()
    live = await w.service.dispatch(w.call())
    task = asyncio.create_task(drain(live))
    await asyncio.wait_for(w.engines[0].hanging.wait(), _STUCK_S)
    assert await w.service.interrupt_all(SluiceError("draining", ErrorKind.UNAVAILABLE)) == 1
    with pytest.raises(SluiceError, match="draining"):
        await asyncio.wait_for(task, _STUCK_S)
    assert w.quota.committed == [("k", len(PROMPT), 0), ("k", len(PROMPT), 1)]
    assert len(w.hooks.finishes()) == 2


async def test_the_requests_id_and_its_callers_trace_reach_every_engine_request_with_tracing_off() -> None:
    w = World([FakeEngine("w1", tokens("a"))])
    parent = f"00-{'ab' * 16}-{'cd' * 8}-01"
    token = context.enter(context.from_headers("client-7", parent, "k=v"))
    try:
        call = w.call([1, 2], [3, 4], n=2)  # made while the request is current: it takes its context
    finally:
        context.leave(token)
    d = await w.service.dispatch(call)
    await drain(d)
    seen = w.engines[0].seen
    assert sorted(r.request_id for r in seen) == ["req-0-0", "req-0-1", "req-1-0", "req-1-1"]  # unique
    assert {r.api_request_id for r in seen} == {"client-7"}  # what the worker is sent as X-Request-Id
    assert all(r.trace_headers == {"traceparent": parent, "tracestate": "k=v"} for r in seen)


async def test_outside_a_request_the_engine_id_is_sent_and_no_trace() -> None:
    w = World([FakeEngine("w1", tokens("a"))])
    await drain(await w.service.dispatch(w.call()))
    (request,) = w.engines[0].seen
    assert request.api_request_id is None and request.trace_headers is None
