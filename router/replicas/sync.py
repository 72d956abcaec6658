"""The replica-sync adapter: how a shared-state backend reads and writes one router's state.

:class:`ReplicaSync` is the :class:`~router.shared.ReplicaSink` a backend
(`router.replicas.redis_state.RedisSharedState`) is started with. It applies other
gateway replicas' index operations, load and learned cost statistics to a
:class:`~router.state.RouterState` and lists this replica's own for the backend to push.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from router.index.prefix_index import EXACT
from router.state import RouterState


class ReplicaSync:
    """A ReplicaSink over `state`; same event loop as the router, nothing blocks."""

    def __init__(self, state: RouterState) -> None:
        self._state = state

    def apply_remote_store(self, worker: str, hashes: Sequence[int], ttl_s: float | None) -> None:
        s = self._state
        if worker in s.workers:
            s.index.store(worker, hashes, expires_at=EXACT if ttl_s is None else s.clock() + ttl_s)

    def apply_remote_remove(self, worker: str, hashes: Sequence[int]) -> None:
        self._state.index.remove(worker, hashes)

    def apply_remote_clear(self, worker: str, exact_only: bool) -> None:
        self._state.index.clear(worker, exact_only=exact_only)

    def set_remote_load(self, worker: str, in_flight: int, queued_prefill_tokens: int) -> None:
        self._state.load.set_remote(worker, in_flight, queued_prefill_tokens)

    def local_entries(self, worker: str) -> Iterator[tuple[int, float | None]]:
        now = self._state.clock()
        for h, exp in list(self._state.index.entries(worker)):
            if exp == EXACT:
                yield h, None
            elif exp > now:
                yield h, exp - now

    def local_loads(self) -> dict[str, tuple[int, int]]:
        return {name: self._state.load.local(name) for name in self._state.workers}

    def worker_names(self) -> list[str]:
        return list(self._state.workers)

    def event_workers(self) -> set[str]:
        return self._state.event_fed & set(self._state.workers)

    def record_task_restart(self, task: str) -> None:
        self._state.record_task_restart(task, "")

    def local_learning(self) -> dict[str, Any]:
        return self._state.learn.export()

    def set_remote_learning(self, parts: Sequence[Mapping[str, Any]]) -> None:
        learn = self._state.learn
        learn.set_remote(parts)
        for model in learn.models():  # the gauge follows what the others learned too
            self._state.metrics.answer_tokens.labels(model).set(learn.answer_tokens(model))
