"""Where a request can run: targets ranked by a backend (one local engine, or routed workers)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from engines.base import EngineRequest, LLMEngine
from engines.errors import ErrorKind, SluiceError


@dataclass(frozen=True, slots=True)
class Target:
    """One engine a request may be sent to, with the router's bookkeeping hooks.

    A target is plain data: `Dispatch` decides when it starts and finishes and
    calls each hook exactly once per attempt (dispatch, first token, finish)."""

    name: str  # stable worker name, returned in X-Sluice-Worker
    engine: LLMEngine
    predicted_cached_tokens: int | None = None
    reason: str | None = None  # the router's decision reason, e.g. prefix_hit or load
    predicted_ttft_s: float | None = None  # the router's predicted time to first token there (None: unknown)
    on_dispatch: Callable[[], None] | None = None
    on_first_token: Callable[[], None] | None = None
    # (reported cached tokens, worker fault, tokens of an answer that ran to its end or None)
    on_finish: Callable[[int | None, bool, int | None], None] | None = None
    # The worker was lost mid-answer (its stream is being resumed elsewhere): the router marks it down.
    on_lost: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class RouteHints:
    policy: str | None = None  # X-Routing-Policy
    session_key: str | None = None  # the router's session header (X-Session-Id by default)
    # The worker that served the conversation's previous turn (a Responses previous_response_id):
    # preferred under the prefix policy unless the cost model predicts another clearly faster.
    prefer_worker: str | None = None
    # The request resumes an answer whose worker was lost (gateway.llm.migration): its first token
    # comes after a prefill of the answer so far, so it is no observation of the worker's TTFT.
    resume: bool = False


class Backend(Protocol):
    """Ranks the engines for a request, best first.

    `rank` must not block or await: the caller dispatches to the first target
    before any other request is ranked. It raises `SluiceError` (NO_WORKER,
    INVALID_ARG for an unknown policy) instead of returning an empty list."""

    def rank(self, request: EngineRequest, hints: RouteHints) -> list[Target]: ...

    def engines(self) -> Sequence[tuple[str, LLMEngine]]: ...

    def ready(self) -> bool: ...

    # True when the model's serving state is the fleet's, the same on every gateway replica (remote
    # workers); False when it is this replica's own (an in-process engine). Readiness counts only
    # the latter: one model losing its last worker must not take every replica out of service.
    shared: bool


class LocalBackend:
    """A single in-process engine."""

    shared = False

    def __init__(self, name: str, engine: LLMEngine) -> None:
        self._target = Target(name, engine)
        self.engine = engine

    def rank(self, request: EngineRequest, hints: RouteHints) -> list[Target]:
        # While the engine's supervisor restarts it, refuse here, before any response
        # starts, so a streaming client gets a 503 with Retry-After too.
        if not self.engine.ready():
            raise SluiceError(f"the engine for model `{request.model}` is restarting; retry shortly",
                              ErrorKind.UNAVAILABLE, code="engine_restarting", retryable=True, retry_after_s=2.0)
        return [self._target]

    def engines(self) -> Sequence[tuple[str, LLMEngine]]:
        return [(self._target.name, self.engine)]

    def ready(self) -> bool:
        return self.engine.ready()
