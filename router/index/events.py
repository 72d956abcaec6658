"""KV-cache events: what they are and how they are decoded (vLLM msgpack, TRT-LLM JSON).

Pure: no sockets, no clocks. `router.index.transports` owns the I/O and
`router.index.applier` turns decoded events into index entries.

vLLM publishes msgspec-encoded ``EventBatch(ts, events, data_parallel_rank)``
whose events are tagged structs ``BlockStored``, ``BlockRemoved`` and
``AllBlocksCleared``. Depending on the version and options a batch or an event
may be a msgpack *array* (fields in declaration order, the tag first for
events, trailing defaults omitted) or a *map* (``{"type": tag, field: ...}``).
Block hashes are ints or bytes. Both are accepted here.

Engine block hashes are not the router's, so a stored event is kept with
its token ids and parent engine hash: that is what lets the applier rebuild the
router's own chain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

EngineHash = int | bytes

# Field order of vLLM's msgspec structs, for the array encoding.
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium", "lora_name", "extra_keys", "group_idx")
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


class EventDecodeError(ValueError):
    """A payload that is not a KV-event batch we understand."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None  # one entry (tuple or None) per block
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[EngineHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float  # engine wall clock (time.time()) when the batch was published
    events: tuple[KVEvent, ...]
    dp_rank: int | None = None


def _hash(v: Any) -> EngineHash:
    if isinstance(v, bool) or not isinstance(v, (int, bytes)):
        raise EventDecodeError(f"block hash must be int or bytes, got {type(v).__name__}")
    return v


# Each field is checked here, so the applier and the index (which hash token ids
# as uint32) only ever see well-typed events: any other exception would end the
# worker's subscriber task.
_MAX_TOKEN_ID = 2**32 - 1


def _seq(v: Any, what: str) -> list[Any] | tuple[Any, ...]:
    if v is None:
        return ()
    if not isinstance(v, (list, tuple)):
        raise EventDecodeError(f"{what} must be an array, got {type(v).__name__}")
    return v


def _int(v: Any, what: str, low: int = 0, high: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low or (high is not None and v > high):
        raise EventDecodeError(f"{what} must be an integer in [{low}, {high if high is not None else 'inf'}], "
                               f"got {v!r:.40}")
    return v


def _opt(v: Any, kind: type, what: str) -> Any:
    if v is not None and (isinstance(v, bool) or not isinstance(v, kind)):
        raise EventDecodeError(f"{what} must be {kind.__name__} or nil, got {type(v).__name__}")
    return v


def _extra_keys(v: Any) -> tuple[Any, ...] | None:
    if v is None:
        return None
    return tuple(None if e is None else tuple(_seq(e, "extra_keys entry")) for e in _seq(v, "extra_keys"))


def _fields(raw: Any, names: Sequence[str]) -> dict[str, Any]:
    if isinstance(raw, dict):
        return {k: raw.get(k) for k in names}
    # Array form: [tag, f0, f1, ...] with trailing defaults omitted; fields a
    # newer vLLM appends beyond the ones we know are ignored.
    values = list(raw[1 : len(names) + 1])
    values += [None] * (len(names) - len(values))
    return dict(zip(names, values, strict=True))


def decode_event(raw: Any) -> KVEvent | None:
    """One vLLM event (map or array); None for an event type we do not use."""
    if isinstance(raw, dict):
        tag = raw.get("type")
    elif isinstance(raw, (list, tuple)) and raw:
        tag = raw[0]
    else:
        raise EventDecodeError(f"event must be a map or a tagged array, got {type(raw).__name__}")
    if tag == "BlockStored":
        f = _fields(raw, _STORED_FIELDS)
        return BlockStored(
            block_hashes=tuple(_hash(h) for h in _seq(f["block_hashes"], "block_hashes")),
            parent_block_hash=None if f["parent_block_hash"] is None else _hash(f["parent_block_hash"]),
            token_ids=tuple(_int(t, "token id", 0, _MAX_TOKEN_ID) for t in _seq(f["token_ids"], "token_ids")),
            block_size=0 if f["block_size"] is None else _int(f["block_size"], "block_size"),
            lora_name=_opt(f["lora_name"], str, "lora_name"),
            extra_keys=_extra_keys(f["extra_keys"]),
            medium=_opt(f["medium"], str, "medium"),
            group_idx=_opt(f["group_idx"], int, "group_idx"),
        )
    if tag == "BlockRemoved":
        f = _fields(raw, _REMOVED_FIELDS)
        return BlockRemoved(tuple(_hash(h) for h in _seq(f["block_hashes"], "block_hashes")),
                            _opt(f["medium"], str, "medium"), _opt(f["group_idx"], int, "group_idx"))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None  # newer vLLM may add event types; ignoring them is safe


def decode_vllm_batch(payload: bytes) -> EventBatch:
    """Decode one msgpack EventBatch payload (array or map encoding)."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as e:  # TypeError: an array as a map key
        raise EventDecodeError(f"not msgpack: {e}") from e
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, (list, tuple)) and len(raw) >= 2:
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) > 2 else None
    else:
        raise EventDecodeError("EventBatch must be a map or an array [ts, events, dp_rank]")
    if (not isinstance(events, (list, tuple)) or isinstance(ts, bool) or not isinstance(ts, (int, float))
            or not math.isfinite(ts)):
        raise EventDecodeError("EventBatch needs a finite numeric ts and a list of events")
    decoded = tuple(e for e in (decode_event(r) for r in events) if e is not None)
    return EventBatch(float(ts), decoded, _opt(rank, int, "data_parallel_rank"))


def decode_trtllm_events(body: Any) -> list[tuple[int, KVEvent | int | None]]:
    """TRT-LLM `/kv_cache_events` JSON -> [(event_id, item)] in order.

    An item is an event; for ``created``, its primary-level capacity in blocks
    (an int); None for events we do not use (``updated``: priority or cache
    level changes), kept so that event-id gap detection stays right.
    Secondary-level (offloaded) stores are marked medium "CPU".
    Raises only EventDecodeError: any other error would end the worker's poller.
    """
    if not isinstance(body, list):
        raise EventDecodeError("kv_cache_events body must be a JSON list")
    try:
        return [_trtllm_item(item) for item in body]
    except EventDecodeError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a field of the wrong shape
        raise EventDecodeError(f"malformed kv cache event: {type(e).__name__}: {e}") from e


def _trtllm_item(item: Any) -> tuple[int, KVEvent | int | None]:
    if not isinstance(item, dict) or not isinstance(item.get("data"), dict):
        raise EventDecodeError("each kv cache event needs an object 'data'")
    eid, data = _int(item.get("event_id", -1), "event_id", -1), item["data"]
    kind = data.get("type")
    if kind == "created":
        levels = data.get("num_blocks_per_cache_level") or []
        return eid, (int(levels[0]) if levels else None)
    if kind == "stored":
        return eid, _trtllm_stored(data)
    if kind == "removed":
        return eid, BlockRemoved(tuple(_hash(h) for h in _seq(data.get("block_hashes"), "block_hashes")))
    return eid, None


def _trtllm_stored(data: dict[str, Any]) -> BlockStored | None:
    blocks = data.get("blocks") or []
    if not blocks:
        return None
    parent = data.get("parent_hash")
    tokens: list[int] = []
    hashes: list[EngineHash] = []
    size = len(blocks[0].get("tokens") or ())
    level = blocks[0].get("cache_level", 0)
    for b in blocks:
        toks = b.get("tokens") or []
        # Extra ids mark multimodal / p-tuning tokens our token-only key cannot see;
        # a partial block is never reused by prefix; both end the routable chain.
        if len(toks) != size or any(t.get("token_extra_id", 0) for t in toks):
            break
        hashes.append(_hash(b["block_hash"]))
        tokens.extend(_int(t["token_id"], "token id", 0, _MAX_TOKEN_ID) for t in toks)
    if not hashes or size == 0:
        return None
    return BlockStored(tuple(hashes), None if parent is None else _hash(parent), tuple(tokens), size,
                       medium="GPU" if level == 0 else "CPU")
