"""Results the router hands to the gateway."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from router.policies import Candidate
from router.telemetry.health import BreakerState


class NoWorkerError(LookupError):
    """No registered, non-draining worker serves the requested model."""


@dataclass(frozen=True, slots=True)
class Ranking:
    """Workers for one request, best first.

    Pass it back to :meth:`router.Router.on_dispatch` with the worker actually
    tried; on a failure before the first byte, try the next candidate.
    """

    model: str
    policy: str
    prompt_tokens: int
    candidates: tuple[Candidate, ...]
    # Block-hash chain of the prompt per block size; used at dispatch to add
    # speculative index entries without hashing the prompt again.
    chains: Mapping[int, tuple[int, ...]] = field(repr=False, default_factory=dict)
    # The same from the unsalted root, for workers that take no `cache_salt` (WorkerInfo.salted_cache
    # false) when the request had one; None: `chains` serve every worker.
    shared_chains: Mapping[int, tuple[int, ...]] | None = field(repr=False, default=None)

    def chain(self, block_size: int, salted_cache: bool = True) -> tuple[int, ...]:
        """The prompt's chain as a worker of this block size and salting caches it (empty if unknown)."""
        chains = self.chains if salted_cache or self.shared_chains is None else self.shared_chains
        return tuple(chains.get(block_size, ()))

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    def candidate(self, worker: str) -> Candidate | None:
        return next((c for c in self.candidates if c.worker == worker), None)


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """A point-in-time view of one worker, for admin endpoints and logs."""

    name: str
    url: str
    models: tuple[str, ...]
    engine: str
    block_size: int
    healthy: bool
    draining: bool
    breaker: BreakerState
    # Requests in flight and their prefill tokens still queued: this replica's plus the other replicas'
    # (through Redis) or the sibling frontends' (router.replicas.node_state), as the router weighs them.
    in_flight: int
    queued_prefill_tokens: int
    index_blocks: int
    kv_events: bool
