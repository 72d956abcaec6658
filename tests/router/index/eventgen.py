"""Builders of vLLM KV-event payloads in both msgpack encodings, for tests.

The map form mirrors msgspec's default struct encoding ({"type": tag, ...});
the array form mirrors `array_like=True` ([tag, field0, field1, ...]).
"""

from __future__ import annotations

from typing import Any

import msgpack


def stored(hashes: list[Any], parent: Any, tokens: list[int], block_size: int, *, array: bool = False,
           lora_name: str | None = None, extra_keys: list[Any] | None = None) -> Any:
    if array:
        ev: list[Any] = ["BlockStored", hashes, parent, tokens, block_size, None, "GPU", lora_name]
        if extra_keys is not None:
            ev.append(extra_keys)
        return ev
    d = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
         "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": lora_name}
    if extra_keys is not None:
        d["extra_keys"] = extra_keys
    return d


def removed(hashes: list[Any], *, array: bool = False) -> Any:
    if array:
        return ["BlockRemoved", hashes, "GPU"]
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def cleared(*, array: bool = False) -> Any:
    return ["AllBlocksCleared"] if array else {"type": "AllBlocksCleared"}


def batch(events: list[Any], ts: float = 0.0, *, array: bool = True) -> bytes:
    body: Any = [ts, events, 0] if array else {"ts": ts, "events": events, "data_parallel_rank": 0}
    return msgpack.packb(body, use_bin_type=True)
