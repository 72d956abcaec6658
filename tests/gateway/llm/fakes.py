"""In-process stand-ins for the LLM core's seams: an engine that plays a script, a
backend that ranks fixed targets, a token quota and router hooks that record what
they were told. No network, no threads, no clock: tests drive them step by step."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client import CollectorRegistry

from engines.base import Delta, EngineRequest, EngineStats, SamplingParams
from engines.errors import ErrorKind, SluiceError
from gateway.llm.admission import Admission, AdmissionConfig
from gateway.llm.dispatch import Dispatch, start_dispatch
from gateway.llm.metrics import LLMMetrics
from gateway.llm.registry import LLMModel
from gateway.llm.targets import RouteHints, Target

# A script step that blocks until the request is aborted, then ends it with finish_reason "abort"
# (the LLMEngine contract for `abort`).
HANG: Literal["hang"] = "hang"
Step = Delta | SluiceError | Literal["hang"]


def retryable(message: str = "connection refused") -> SluiceError:
    """What a remote engine raises when a worker cannot be reached before the first byte."""
    return SluiceError(message, ErrorKind.UNAVAILABLE, retryable=True)


def tokens(*texts: str, cached: int | None = None, finish: Literal["stop", "length"] = "stop") -> list[Step]:
    """One delta (and one token id) per text, the last with `finish` and the engine's usage."""
    out: list[Step] = [Delta(text=t, token_ids=[i], completion_tokens=i + 1) for i, t in enumerate(texts)]
    out.append(Delta(finish_reason=finish, completion_tokens=len(texts), cached_tokens=cached))
    return out


class FakeEngine:
    """An LLMEngine whose `generate` plays `script` (the same one for every request).

    Records the requests it was given, the ids aborted, and the ids whose generator
    ended (normally, by raising, or by being closed by its consumer)."""

    def __init__(self, name: str, script: Sequence[Step] = ()) -> None:
        self.name = name
        self.script = list(script)
        self.requests: list[str] = []
        self.seen: list[EngineRequest] = []  # the requests themselves, as sent
        self.aborted: list[str] = []
        self.ended: list[str] = []
        self.hanging = asyncio.Event()  # set when a request reaches HANG
        self._aborts: dict[str, asyncio.Event] = {}

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def generate(self, request: EngineRequest) -> AsyncGenerator[Delta, None]:
        rid = request.request_id
        self.requests.append(rid)
        self.seen.append(request)
        aborted = self._aborts.setdefault(rid, asyncio.Event())
        try:
            for step in self.script:
                if isinstance(step, SluiceError):
                    raise step
                if step == HANG:
                    self.hanging.set()
                    await aborted.wait()
                    yield Delta(finish_reason="abort")
                    return
                assert isinstance(step, Delta)
                yield step
        finally:
            self.ended.append(rid)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self._aborts.setdefault(request_id, asyncio.Event()).set()

    def stats(self) -> EngineStats:
        return EngineStats(running=0, waiting=0)

    def ready(self) -> bool:
        return True


@dataclass
class Hooks:
    """Records the router hooks `Dispatch` calls on targets, in order."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def target(self, engine: FakeEngine) -> Target:
        name = engine.name
        return Target(name, engine,
                      on_dispatch=lambda: self.calls.append(("dispatch", name)),
                      on_first_token=lambda: self.calls.append(("first_token", name)),
                      on_finish=lambda cached, fault, answered: self.calls.append(
                          ("finish", name, cached, fault, answered)))

    def finishes(self, name: str | None = None) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == "finish" and (name is None or c[1] == name)]

    def of(self, kind: str) -> list[str]:
        return [c[1] for c in self.calls if c[0] == kind]


class FakeBackend:
    """Ranks the same engines, in order, for every request; or raises `error`."""

    shared = False

    def __init__(self, hooks: Hooks, engines: Sequence[FakeEngine], log: list[str] | None = None) -> None:
        self.hooks = hooks
        self._engines = list(engines)
        self.error: SluiceError | None = None
        self.log = log if log is not None else []

    def rank(self, request: EngineRequest, hints: RouteHints) -> list[Target]:
        self.log.append("rank")
        if self.error is not None:
            raise self.error
        return [self.hooks.target(e) for e in self._engines]

    def engines(self) -> Sequence[tuple[str, FakeEngine]]:
        return [(e.name, e) for e in self._engines]

    def ready(self) -> bool:
        return True


class FakeQuota:
    """A TokenQuota that records every call (in a log shared with the backend, to check the order)."""

    def __init__(self, log: list[str] | None = None) -> None:
        self.log = log if log is not None else []
        self.reserved: list[tuple[str, int]] = []
        self.refunded: list[tuple[str, int]] = []
        self.committed: list[tuple[str, int, int]] = []
        self.refuse: SluiceError | None = None

    async def reserve_tokens(self, key_id: str, tokens: int) -> None:
        self.log.append("reserve")
        if self.refuse is not None:
            raise self.refuse
        self.reserved.append((key_id, tokens))

    def refund_tokens(self, key_id: str, tokens: int) -> None:
        self.log.append("refund")
        self.refunded.append((key_id, tokens))

    def commit_tokens(self, key_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        self.log.append("commit")
        self.committed.append((key_id, prompt_tokens, completion_tokens))


@dataclass(frozen=True)
class FakeTokenizer:
    """All `LLMService` reads of a tokenizer: the vocabulary size (parameter checks)."""

    vocab_size: int = 1000


def make_model(backend: Any, name: str = "m", admission: AdmissionConfig | None = None) -> LLMModel:
    return LLMModel(name, FakeTokenizer(), 4096, backend, Admission(admission or AdmissionConfig()))


def request(rid: str, model: str = "m", prompt: Sequence[int] = (1, 2, 3)) -> EngineRequest:
    return EngineRequest(rid, model, list(prompt), SamplingParams(max_tokens=16))


def dispatch(hooks: Hooks, *ranked: Sequence[FakeEngine], model: LLMModel | None = None
             ) -> tuple[Dispatch, LLMModel]:
    """A started dispatch of one engine request per `ranked` list (its targets, best first)."""
    model = model or make_model(None)
    requests = [request(f"r-{i}") for i in range(len(ranked))]
    targets = [[hooks.target(e) for e in engines] for engines in ranked]
    d = start_dispatch(LLMMetrics(CollectorRegistry()), model, requests, targets,
                       model.admission.try_admit(len(requests)), "r")
    return d, model


async def drain(d: Dispatch) -> tuple[str, list[Delta]]:
    """Consume a dispatch to its end: the text and the deltas of choice 0."""
    deltas = [delta async for i, delta in d.deltas() if i == 0]
    return "".join(x.text for x in deltas), deltas
