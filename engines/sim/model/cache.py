"""The simulated KV block pool with prefix caching. Pure, no I/O, no clock.

It behaves like vLLM's block pool in the ways routing can observe:

- A fixed number of blocks of `block_size` tokens. A block is *in use* while a
  running request holds it (reference count > 0), else *free*.
- Only full blocks are cached: a computed full block is registered under its
  chained hash (`commit`), and a later request whose prompt starts with the same
  blocks reuses them (`match` then `acquire`).
- Free blocks wait in one queue in eviction order. A free block keeps its cached
  content until the pool hands it out again, which evicts it (`BlockRemoved`).
  `release` appends a request's blocks in reverse, so a chain's tail is evicted
  before its head, which other prompts are likelier to share (vLLM does the same).

Events (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`) collect until
`take_events`. Not thread-safe; one engine owns one pool.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from engines.sim.model.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


class BlockCache:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._refs = [0] * num_blocks
        self._hashes: list[int | None] = [None] * num_blocks
        # Free blocks, the next one to hand out first. Dict order gives O(1) removal of a
        # cached block that a prefix hit takes back.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._events: list[KVEvent] = []

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks holding a reusable prefix, in use or not."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (vllm:kv_cache_usage_perc): cached free blocks do not count."""
        return 1.0 - len(self._free) / self.num_blocks

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._cached

    def ref_count(self, block_id: int) -> int:
        return self._refs[block_id]

    def match(self, block_hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest cached run of `block_hashes` from the first one."""
        out: list[int] = []
        for h in block_hashes:
            block = self._cached.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def free_among(self, block_ids: Sequence[int]) -> int:
        """How many of these blocks are free now (acquiring them takes them out of the free queue)."""
        return sum(1 for b in block_ids if self._refs[b] == 0)

    def can_allocate(self, n: int, reusing: Sequence[int] = ()) -> bool:
        """Whether `n` new blocks fit after `reusing` (cached blocks about to be acquired) are taken."""
        return n + self.free_among(reusing) <= len(self._free)

    def acquire(self, block_ids: Sequence[int]) -> None:
        """Take a reference on cached blocks (a prefix hit)."""
        for b in block_ids:
            if self._refs[b] == 0:
                del self._free[b]
            self._refs[b] += 1

    def allocate(self, n: int) -> list[int]:
        """`n` blocks from the head of the free queue, evicting whatever they cached.

        Raises ValueError if fewer than `n` are free: check `can_allocate` first."""
        if n > len(self._free):
            raise ValueError(f"{n} blocks asked for, {len(self._free)} free")
        out: list[int] = []
        evicted: list[int] = []
        for _ in range(n):
            block, _none = self._free.popitem(last=False)
            old = self._hashes[block]
            if old is not None:
                self._hashes[block] = None
                if self._cached.get(old) == block:
                    del self._cached[old]
                    evicted.append(old)
            self._refs[block] = 1
            out.append(block)
        if evicted:
            self._events.append(BlockRemoved(tuple(evicted)))
        return out

    def release(self, block_ids: Sequence[int]) -> None:
        """Drop one reference on each block; blocks nobody holds become free, tail first."""
        for b in reversed(block_ids):
            if self._refs[b] <= 0:
                raise ValueError(f"block {b} released more often than acquired")
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None

    def commit(self, block_id: int, block_hash: int) -> None:
        """Register a computed full block under its hash, so later prompts can hit it.

        If another block already caches this hash (vLLM recomputes the last prompt
        token, so a prompt of whole blocks recomputes its last block), the copy stays
        uncached and is reused silently."""
        if self._refs[block_id] <= 0:
            raise ValueError(f"block {block_id} is not in use")
        if block_hash not in self._cached:
            self._cached[block_hash] = block_id
            self._hashes[block_id] = block_hash

    def record(self, event: BlockStored) -> None:
        """Queue the BlockStored event the scheduler built for one request's new blocks."""
        self._events.append(event)

    def reset(self) -> bool:
        """Forget every cached prefix (vLLM's reset_prefix_cache); False while any block is in use."""
        if len(self._free) != self.num_blocks:
            return False
        self._cached.clear()
        self._hashes = [None] * self.num_blocks
        self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events
