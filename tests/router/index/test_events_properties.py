"""Properties of the vLLM KV-event decoder (`router.index.events.decode_vllm_batch`).

The subscriber task of a worker ends on any exception but `EventDecodeError`, and with it the
exact index for that worker, so:
- arbitrary bytes, and arbitrary msgpack documents, fail only with `EventDecodeError`;
- a batch that decodes can always be applied to the index (`EventApplier`) without raising;
- every valid batch, in both of vLLM's encodings (msgspec arrays or maps), decodes to the
  events it was built from.
"""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from router.index.applier import EventApplier
from router.index.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventDecodeError,
    decode_trtllm_events,
    decode_vllm_batch,
)
from router.index.prefix_index import PrefixIndex
from tests.properties import bounded
from tests.router.index import eventgen as g


def decode_and_apply(payload: bytes) -> EventBatch | None:
    """Decode; None when refused with the decoder's own error. A decoded batch must apply."""
    try:
        batch = decode_vllm_batch(payload)
    except EventDecodeError:
        return None
    index = PrefixIndex(10_000)
    index.add_worker("w")
    applier = EventApplier("w", ["m"], index, max_mapped_blocks=1000)
    for event in batch.events:
        applier.apply(event)
    return batch


@bounded(400)
@given(payload=st.binary(max_size=512))
def test_arbitrary_bytes_raise_only_the_decoder_error(payload: bytes) -> None:
    decode_and_apply(payload)


# Every msgpack type: nil, bool, ints of every width, floats, str, bin, ext, arrays, maps
# (whose keys may themselves be arrays, which Python cannot hash).
leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
                   st.text(max_size=6), st.binary(max_size=6),
                   st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
                   st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "GPU", "type"]))
documents = st.recursive(leaves, lambda inner: st.lists(inner, max_size=5) |
                         st.dictionaries(st.one_of(st.text(max_size=4), st.integers(-9, 2**64 - 1), st.sampled_from(
                             ["type", "block_hashes", "token_ids", "ts", "events"])), inner, max_size=4),
                         max_leaves=20)


def _pack(doc: Any) -> bytes:
    return msgpack.packb(doc, use_bin_type=True)


@bounded(400)
@given(doc=documents)
def test_arbitrary_msgpack_documents_raise_only_the_decoder_error(doc: Any) -> None:
    decode_and_apply(_pack(doc))


@bounded(200)
@given(key=st.lists(st.integers(-9, 9), max_size=2), value=documents)
def test_a_map_keyed_by_an_array_is_the_decoder_error(key: list[int], value: Any) -> None:
    payload = b"\x81" + _pack(key) + _pack(value)  # {[...]: value}: valid msgpack, unhashable in Python
    assert decode_and_apply(payload) is None


# ---- batches whose fields are valid or anything at all -----------------------------------------
hashes = st.one_of(st.integers(0, 2**64 - 1), st.integers(-(2**63), -1), st.binary(min_size=1, max_size=32))
token_ids = st.integers(0, 2**32 - 1)


@st.composite
def stored_events(draw: st.DrawFn) -> tuple[Any, BlockStored]:
    """(one BlockStored as vLLM encodes it, the event it must decode to)."""
    block_size = draw(st.integers(1, 4))
    n = draw(st.integers(0, 3))
    block_hashes = draw(st.lists(hashes, min_size=n, max_size=n))
    tokens = draw(st.lists(token_ids, min_size=n * block_size, max_size=n * block_size))
    parent = draw(st.one_of(st.none(), hashes))
    lora = draw(st.one_of(st.none(), st.text(max_size=5)))
    extra = draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.lists(st.text(max_size=3), max_size=2)),
                                               min_size=n, max_size=n)))
    array = draw(st.booleans())
    raw = g.stored(block_hashes, parent, tokens, block_size, array=array, lora_name=lora, extra_keys=extra)
    event = BlockStored(tuple(block_hashes), parent, tuple(tokens), block_size, lora_name=lora,
                        extra_keys=None if extra is None else tuple(None if e is None else tuple(e) for e in extra),
                        medium="GPU")
    return raw, event


@st.composite
def removed_events(draw: st.DrawFn) -> tuple[Any, BlockRemoved]:
    block_hashes = draw(st.lists(hashes, max_size=4))
    return g.removed(block_hashes, array=draw(st.booleans())), BlockRemoved(tuple(block_hashes), "GPU")


@st.composite
def cleared_events(draw: st.DrawFn) -> tuple[Any, AllBlocksCleared]:
    return g.cleared(array=draw(st.booleans())), AllBlocksCleared()


events = st.one_of(stored_events(), removed_events(), cleared_events())


@bounded(300)
@given(pairs=st.lists(events, max_size=6), ts=st.floats(0, 2e9), array=st.booleans())
def test_valid_batches_decode_to_the_events_they_were_built_from(pairs: list[tuple[Any, Any]], ts: float,
                                                                 array: bool) -> None:
    payload = g.batch([raw for raw, _ in pairs], ts=ts, array=array)
    batch = decode_and_apply(payload)
    assert batch is not None
    assert batch.ts == ts and batch.dp_rank == 0
    assert list(batch.events) == [event for _, event in pairs]


@st.composite
def corrupted_batches(draw: st.DrawFn) -> bytes:
    """A valid batch with one field of one event (or of the batch) replaced by any value."""
    pairs = draw(st.lists(events, min_size=1, max_size=3))
    raws = [raw for raw, _ in pairs]
    body: Any = [draw(st.floats(0, 2e9)), raws, 0]
    target = draw(st.integers(0, len(raws)))
    value = draw(documents)
    if target == len(raws):
        body[draw(st.integers(0, 2))] = value
    elif isinstance(raws[target], dict):
        raws[target][draw(st.sampled_from(sorted(raws[target])))] = value
    else:
        raws[target][draw(st.integers(0, len(raws[target]) - 1))] = value
    return _pack(body)


@bounded(400)
@given(payload=corrupted_batches())
def test_one_bad_field_is_the_decoder_error_or_a_batch_that_applies(payload: bytes) -> None:
    decode_and_apply(payload)


def test_field_types_the_applier_cannot_use_are_refused() -> None:
    for event in (["BlockStored", 5, None, [1], 4], ["BlockStored", [1], None, ["a"], 4],
                  ["BlockStored", [1], None, [2**32], 4], ["BlockStored", [1], None, [-1], 4],
                  ["BlockStored", [1], None, [True], 4], ["BlockStored", [1], None, [1.5], 4],
                  ["BlockStored", [1], None, [1], "4"], ["BlockStored", [1], None, [1], 4, None, None, 7],
                  ["BlockStored", [1], None, [1], 4, None, None, None, [5]], ["BlockRemoved", 3],
                  ["BlockRemoved", [1], 5]):
        assert decode_and_apply(g.batch([event])) is None, event
    assert decode_and_apply(_pack([float("nan"), [], 0])) is None
    assert decode_and_apply(_pack([0.0, [], "rank"])) is None


# ---- TRT-LLM's /kv_cache_events JSON ------------------------------------------------------------
json_leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**65), 2**65), st.floats(allow_nan=False),
                        st.text(max_size=5), st.sampled_from(["created", "stored", "removed", "updated", "data",
                                                             "blocks", "tokens", "token_id", "block_hash"]))
json_documents = st.recursive(json_leaves, lambda inner: st.lists(inner, max_size=4) |
                              st.dictionaries(st.sampled_from(["type", "data", "event_id", "blocks", "tokens",
                                                               "token_id", "block_hash", "block_hashes",
                                                               "parent_hash", "cache_level", "token_extra_id",
                                                               "num_blocks_per_cache_level"]), inner, max_size=5),
                              max_leaves=25)


@bounded(400)
@given(body=json_documents)
def test_arbitrary_trtllm_json_raises_only_the_decoder_error(body: Any) -> None:
    try:
        items = decode_trtllm_events(body)
    except EventDecodeError:
        return
    index = PrefixIndex(10_000)
    index.add_worker("w")
    applier = EventApplier("w", ["m"], index, max_mapped_blocks=1000)
    for _, item in items:
        if item is not None and not isinstance(item, int):
            applier.apply(item)


@st.composite
def trtllm_stored(draw: st.DrawFn) -> dict[str, Any]:
    size = draw(st.integers(1, 3))
    blocks = [{"block_hash": draw(st.integers(0, 2**63)), "cache_level": 0,
               "tokens": [{"token_id": draw(st.one_of(token_ids, json_leaves)), "token_extra_id": 0}
                          for _ in range(size)]} for _ in range(draw(st.integers(1, 3)))]
    return {"event_id": draw(st.integers(0, 100)), "data": {"type": "stored", "parent_hash": None, "blocks": blocks}}


@bounded(200)
@given(body=st.lists(trtllm_stored(), max_size=3))
def test_trtllm_token_ids_outside_uint32_are_the_decoder_error(body: list[dict[str, Any]]) -> None:
    ids = [t["token_id"] for e in body for b in e["data"]["blocks"] for t in b["tokens"]]
    valid = all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in ids)
    try:
        items = decode_trtllm_events(body)
    except EventDecodeError:
        assert not valid
    else:
        assert valid and all(isinstance(item, BlockStored) for _, item in items)
