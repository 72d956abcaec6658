"""The seam between a router and state shared with other gateway replicas.

The router never waits on shared state: it routes on its local index and
load, pushes its own changes through the non-blocking ``publish_*`` calls, and
receives other replicas' changes through a :class:`ReplicaSink`
(`router.replicas.sync.ReplicaSync`). An implementation therefore only has to be
*eventually* consistent, and a replica keeps routing while the backend is down.

Two backends: Redis, between gateway replicas anywhere (`router.replicas.redis_state`), and the
frontends of one `--frontends N` server on one node, over Unix sockets (`router.replicas.node_state`),
which also share what the cost learned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol


class ReplicaSink(Protocol):
    """What a shared-state backend may call on the local router (same event loop).

    Every method returns at once; unknown worker names are ignored.
    """

    def apply_remote_store(self, worker: str, hashes: Sequence[int], ttl_s: float | None) -> None:
        """Another replica saw `worker` store `hashes`; ttl None means exact."""

    def apply_remote_remove(self, worker: str, hashes: Sequence[int]) -> None: ...

    def apply_remote_clear(self, worker: str, exact_only: bool) -> None: ...

    def set_remote_load(self, worker: str, in_flight: int, queued_prefill_tokens: int) -> None:
        """Sum over the *other* replicas; replaces the previous value."""

    def local_entries(self, worker: str) -> Iterable[tuple[int, float | None]]:
        """(hash, remaining ttl_s or None for exact) of the local index, for a resync push."""

    def local_loads(self) -> dict[str, tuple[int, int]]:
        """This replica's (in_flight, queued_prefill_tokens) per worker."""

    def worker_names(self) -> list[str]: ...

    def event_workers(self) -> set[str]:
        """Workers whose KV events this replica has applied itself (it may vouch for their exact entries)."""

    def record_task_restart(self, task: str) -> None:
        """The backend's sync loop failed unexpectedly (not an outage) and is starting over."""

    def local_learning(self) -> dict[str, Any]:
        """What this replica's cost learned from its own observations (`router.learning.CostLearner.export`)."""

    def set_remote_learning(self, parts: Sequence[Mapping[str, Any]]) -> None:
        """The other replicas' `local_learning()`, replacing the previous ones; ValueError if malformed."""


class SharedState(Protocol):
    """A backend that spreads index and load changes between replicas."""

    @property
    def backend(self) -> str:
        """"redis" or "node" (a metric says whether Redis is reachable only for the first)."""

    @property
    def connected(self) -> bool:
        """True while the backend is reachable (exported as a gauge)."""

    async def start(self, sink: ReplicaSink) -> None:
        """Begin syncing; must return even when the backend is unreachable."""

    async def stop(self) -> None: ...

    def publish_store(self, worker: str, hashes: Sequence[int], ttl_s: float | None) -> None:
        """Queue a store; never blocks, never raises for backend trouble."""

    def publish_remove(self, worker: str, hashes: Sequence[int]) -> None: ...

    def publish_clear(self, worker: str, exact_only: bool) -> None: ...
