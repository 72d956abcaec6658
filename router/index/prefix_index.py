"""The prefix index: which worker holds which block.

Each worker has an LRU-ordered map ``block hash -> expires_at``:

* **exact** entries (``expires_at = inf``) come from KV events and stay until a
  removal event, a clear, or LRU eviction;
* **speculative** entries (finite ``expires_at``) are added when a request is
  dispatched, because the engine will hold those blocks shortly and vLLM never
  re-announces cache hits; they also carry approximate mode, where a worker
  publishes no events at all and its LRU capacity is modelled by the map's
  bound.

Memory is bounded: a worker's map holds at most its capacity in blocks and
evicts least-recently-used entries beyond that. Time is passed in (``now``,
seconds on any monotonic-ish clock the caller uses consistently), so the index
is pure and deterministic. Not thread-safe; the router calls it from one
event loop.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice

EXACT = math.inf


class PrefixIndex:
    """Per-worker block sets with TTL and LRU bounds."""

    def __init__(self, max_blocks_per_worker: int) -> None:
        if max_blocks_per_worker < 1:
            raise ValueError("max_blocks_per_worker must be >= 1")
        self._max = max_blocks_per_worker
        self._blocks: dict[str, OrderedDict[int, float]] = {}
        self._capacity: dict[str, int] = {}
        self.evictions = 0  # entries dropped by the LRU bound, all workers

    # -- workers -------------------------------------------------------------
    def add_worker(self, worker: str, capacity_blocks: int | None = None) -> None:
        """Track `worker`; keeps its entries if already tracked."""
        self._blocks.setdefault(worker, OrderedDict())
        self.set_capacity(worker, capacity_blocks)

    def remove_worker(self, worker: str) -> None:
        self._blocks.pop(worker, None)
        self._capacity.pop(worker, None)

    def set_capacity(self, worker: str, capacity_blocks: int | None) -> None:
        """Bound `worker` to min(capacity, max_blocks_per_worker) blocks; evicts LRU now."""
        if capacity_blocks is not None and capacity_blocks < 1:
            raise ValueError("capacity_blocks must be >= 1")
        cap = self._max if capacity_blocks is None else min(capacity_blocks, self._max)
        self._capacity[worker] = cap
        self._evict(worker)

    def size(self, worker: str) -> int:
        return len(self._blocks.get(worker, ()))

    # -- mutations -----------------------------------------------------------
    def store(self, worker: str, hashes: Iterable[int], *, expires_at: float = EXACT) -> list[int]:
        """Record that `worker` holds `hashes` (in chain order).

        ``expires_at=EXACT`` marks them exact; a finite value marks them
        speculative. An exact entry is never downgraded; a speculative entry
        keeps the later expiry. Each stored entry becomes most-recently-used.
        Returns the hashes that were not present before (for rollback).
        Unknown workers are ignored (an event racing a removal).
        """
        blocks = self._blocks.get(worker)
        if blocks is None:
            return []
        added: list[int] = []
        for h in hashes:
            old = blocks.get(h)
            if old is None:
                added.append(h)
                blocks[h] = expires_at
            else:
                blocks[h] = max(old, expires_at)
                blocks.move_to_end(h)
        self._evict(worker)
        return added

    def remove(self, worker: str, hashes: Iterable[int], *, speculative_only: bool = False) -> int:
        """Drop `hashes` from `worker`; returns how many were present and dropped."""
        blocks = self._blocks.get(worker)
        if blocks is None:
            return 0
        n = 0
        for h in hashes:
            exp = blocks.get(h)
            if exp is None or (speculative_only and exp == EXACT):
                continue
            del blocks[h]
            n += 1
        return n

    def clear(self, worker: str, *, exact_only: bool = False) -> None:
        """Forget `worker`'s blocks (an engine reset, or a KV-event gap).

        With ``exact_only`` the speculative entries stay: after an event gap
        they are still the best guess we have.
        """
        blocks = self._blocks.get(worker)
        if blocks is None:
            return
        if not exact_only:
            blocks.clear()
            return
        for h in [h for h, exp in blocks.items() if exp == EXACT]:
            del blocks[h]

    def prune(self, now: float, max_scan: int = 10_000) -> int:
        """Drop the expired among each worker's `max_scan` least recently used entries; returns how many.

        Bounded so that one call stays cheap; entries beyond the scan expire on a later call or when
        `match` meets them.
        """
        dropped = 0
        for blocks in self._blocks.values():
            stale = [h for h, exp in islice(blocks.items(), max_scan) if exp <= now]
            for h in stale:
                del blocks[h]
            dropped += len(stale)
        return dropped

    def _evict(self, worker: str) -> None:
        blocks = self._blocks[worker]
        cap = self._capacity.get(worker, self._max)
        while len(blocks) > cap:
            blocks.popitem(last=False)
            self.evictions += 1

    # -- queries -------------------------------------------------------------
    def match(self, hashes_by_worker: Mapping[str, Sequence[int]], now: float) -> dict[str, int]:
        """Longest matched prefix, in blocks, for each worker in the mapping.

        Each worker is given the chain for its own block size. Expired entries
        found on the way are dropped (the only mutation). Matching does not
        refresh LRU order: a match is a prediction, not a use.
        """
        out: dict[str, int] = {}
        for worker, hashes in hashes_by_worker.items():
            blocks = self._blocks.get(worker)
            n = 0
            if blocks:
                # map() runs the lookups in C: the walk was most of a decision's time for a long prompt.
                for exp in map(blocks.get, hashes):
                    if exp is None:
                        break
                    if exp <= now:
                        del blocks[hashes[n]]
                        break
                    n += 1
            out[worker] = n
        return out

    def entries(self, worker: str) -> Iterator[tuple[int, float]]:
        """(hash, expires_at) of `worker`, least recently used first. Do not mutate while iterating."""
        return iter(self._blocks.get(worker, {}).items())
