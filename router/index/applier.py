"""Applying one worker's decoded KV events to the prefix index.

Engine block hashes are not the router's (vLLM: sha256 over pickled tuples;
TRT-LLM: its own). A stored event carries the blocks' token ids and the
parent's engine hash, so :class:`EventApplier` recomputes the router's chain
from the parent's router hash and keeps an engine-hash -> router-hash map per
worker; that map is what lets a later ``BlockRemoved`` (which carries engine
hashes only) find its entries. Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.index.events import AllBlocksCleared, BlockRemoved, BlockStored, EngineHash, KVEvent
from router.index.hashing import chain_hash, root_hash
from router.index.prefix_index import EXACT, PrefixIndex

# Offloaded (CPU, disk) copies cannot serve a prefix hit on the GPU the router predicts for.
_PRIMARY_MEDIA = (None, "GPU")


@dataclass(slots=True)
class ApplyStats:
    unresolved_blocks: int = 0  # parent unknown (missed events) or not representable
    ignored_events: int = 0  # other media, other KV groups


class EventApplier:
    """Applies one worker's events to the index. Not thread-safe; one per worker.

    `models` are the model ids the worker serves: a stored block is indexed
    under each one's salted chain (workers almost always serve one name).
    Mutates the index entries of `worker` only.
    """

    def __init__(self, worker: str, models: Sequence[str], index: PrefixIndex,
                 max_mapped_blocks: int) -> None:
        self.worker = worker
        self.models = tuple(models)
        self._index = index
        self._max = max_mapped_blocks
        self._map: OrderedDict[EngineHash, tuple[int, ...]] = OrderedDict()
        self.stats = ApplyStats()
        self.observed_block_size: int | None = None

    @property
    def mapped_blocks(self) -> int:
        """Engine hashes currently mapped (memory accounting)."""
        return len(self._map)

    def reset(self) -> None:
        """Forget the hash map and the worker's exact entries (engine restart, event gap)."""
        self._map.clear()
        self._index.clear(self.worker, exact_only=True)

    def apply(self, event: KVEvent) -> list[int]:
        """Apply one event; returns router hashes newly marked exact (for sharing)."""
        if isinstance(event, AllBlocksCleared):
            self._map.clear()
            self._index.clear(self.worker)
            return []
        if event.medium not in _PRIMARY_MEDIA or event.group_idx not in (None, 0):
            self.stats.ignored_events += 1
            return []
        if isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                mine = self._map.pop(h, None)
                if mine is not None:
                    self._index.remove(self.worker, mine)
            return []
        return self._stored(event)

    def removed_router_hashes(self, event: BlockRemoved) -> list[int]:
        """Router hashes a removal will drop (call before `apply`, for sharing)."""
        return [r for h in event.block_hashes for r in self._map.get(h, ())]

    def _stored(self, ev: BlockStored) -> list[int]:
        n = len(ev.block_hashes)
        if n == 0 or len(ev.token_ids) < n or len(ev.token_ids) % n:
            self.stats.unresolved_blocks += n
            return []
        size = len(ev.token_ids) // n
        self.observed_block_size = size
        chain = self._parent_chain(ev)
        if chain is None:
            self.stats.unresolved_blocks += n
            return []
        stored: list[int] = []
        for i, eh in enumerate(ev.block_hashes):
            if i > 0 and self._extra(ev, i):
                # Beyond the root, only the LoRA name may appear; anything else is
                # multimodal or prompt-embedding content that token ids cannot express.
                self.stats.unresolved_blocks += n - i
                break
            toks = ev.token_ids[i * size : (i + 1) * size]
            chain = tuple(chain_hash(p, toks) for p in chain)
            self._map[eh] = chain
            self._map.move_to_end(eh)
            stored.extend(chain)
        while len(self._map) > self._max:
            self._map.popitem(last=False)
        self._index.store(self.worker, stored, expires_at=EXACT)
        return stored

    def _parent_chain(self, ev: BlockStored) -> tuple[int, ...] | None:
        """Router hashes (one per model) the event's first block chains from; None if unknown."""
        if ev.parent_block_hash is not None:
            return self._map.get(ev.parent_block_hash)
        keys = self._extra(ev, 0)
        if not keys:
            salt = None
        elif len(keys) == 1 and isinstance(keys[0], str):
            salt = keys[0] or None  # the request's cache_salt
        else:
            return None  # multimodal or prompt-embedding content in the very first block
        return tuple(root_hash(m, ev.lora_name, salt) for m in self.models)

    def _extra(self, ev: BlockStored, i: int) -> list[Any]:
        """Block `i`'s extra hash keys other than the LoRA name."""
        keys = list((ev.extra_keys[i] if ev.extra_keys and i < len(ev.extra_keys) else None) or ())
        if ev.lora_name is not None and ev.lora_name in keys:
            keys.remove(ev.lora_name)
        return keys
