"""Where a request can run: targets ranked by a backend (one local engine or routed workers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from engines.base import EngineRequest, LLMEngine


@dataclass(slots=True)
class Target:
    """One engine a request may be sent to, with the router's bookkeeping hooks."""

    name: str  # stable worker name, returned in X-Sluice-Worker
    engine: LLMEngine
    predicted_cached_tokens: int | None = None
    reason: str | None = None  # the router's decision reason, e.g. prefix_hit or load
    on_dispatch: Callable[[], None] | None = None
    on_first_token: Callable[[], None] | None = None
    on_finish: Callable[[int | None, bool], None] | None = None  # (reported cached tokens, failed)
    # on_dispatch may run at routing time (see gateway.openai.streaming.dispatch), long
    # before the stream starts; these make start/finish idempotent and paired.
    dispatched: bool = False
    finished: bool = False

    def start(self) -> None:
        """Tell the router this target was chosen; once, however often called."""
        if not self.dispatched:
            self.dispatched = True
            if self.on_dispatch:
                self.on_dispatch()

    def finish(self, cached_tokens: int | None, failed: bool) -> None:
        """Report the outcome of a started target; once. No-op if never started."""
        if self.dispatched and not self.finished:
            self.finished = True
            if self.on_finish:
                self.on_finish(cached_tokens, failed)


@dataclass(frozen=True, slots=True)
class RouteHints:
    policy: str | None = None  # X-Routing-Policy
    session_key: str | None = None  # X-Session-Id (or the configured header)


class Backend(Protocol):
    """Ranks the engines for a request, best first. Must not block."""

    def rank(self, request: EngineRequest, hints: RouteHints) -> list[Target]: ...

    def engines(self) -> Sequence[tuple[str, LLMEngine]]: ...

    def ready(self) -> bool: ...


class LocalBackend:
    """A single in-process engine."""

    def __init__(self, name: str, engine: LLMEngine) -> None:
        self._target_name = name
        self.engine = engine

    def rank(self, request: EngineRequest, hints: RouteHints) -> list[Target]:
        return [Target(self._target_name, self.engine)]

    def engines(self) -> Sequence[tuple[str, LLMEngine]]:
        return [(self._target_name, self.engine)]

    def ready(self) -> bool:
        return self.engine.ready()
