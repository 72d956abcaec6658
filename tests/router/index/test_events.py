from __future__ import annotations

import pytest

from router.index.applier import EventApplier
from router.index.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    decode_trtllm_events,
    decode_vllm_batch,
)
from router.index.hashing import block_hashes, root_hash
from router.index.prefix_index import PrefixIndex
from tests.router.index import eventgen as g

BS = 4
TOKENS = list(range(100, 116))  # 4 blocks of 4


def setup() -> tuple[PrefixIndex, EventApplier]:
    idx = PrefixIndex(1000)
    idx.add_worker("w")
    return idx, EventApplier("w", ["m"], idx, max_mapped_blocks=1000)


def chain(tokens=TOKENS, lora=None, salt=None):
    return block_hashes(tokens, BS, root_hash("m", lora, salt))


def matched(idx, tokens=TOKENS, **kw) -> int:
    return idx.match({"w": chain(tokens, **kw)}, now=0)["w"]


@pytest.mark.parametrize("array", [False, True])
def test_decode_both_encodings_and_hash_types(array):
    evs = [g.stored([1, b"\x02" * 32], None, TOKENS[:8], BS, array=array), g.removed([1], array=array),
           g.cleared(array=array), {"type": "SomethingNew"}]
    b = decode_vllm_batch(g.batch(evs, ts=5.0, array=array))
    assert b.ts == 5.0 and b.dp_rank == 0
    assert [type(e) for e in b.events] == [BlockStored, BlockRemoved, AllBlocksCleared]
    assert b.events[0].block_hashes == (1, b"\x02" * 32)
    assert b.events[0].token_ids == tuple(TOKENS[:8])


def test_decode_rejects_garbage():
    with pytest.raises(EventDecodeError):
        decode_vllm_batch(b"\xc1")
    with pytest.raises(EventDecodeError):
        decode_vllm_batch(g.batch([["BlockStored", [1.5], None, [1, 2, 3, 4], 4]]))


def test_store_chain_then_continue_from_parent_then_remove():
    idx, ap = setup()
    ap.apply(decode_vllm_batch(g.batch([g.stored([11, 12], None, TOKENS[:8], BS)])).events[0])
    assert matched(idx) == 2
    ap.apply(decode_vllm_batch(g.batch([g.stored([13, 14], 12, TOKENS[8:], BS)])).events[0])
    assert matched(idx) == 4
    ap.apply(BlockRemoved((13,)))  # engine hash -> router hash mapping makes removal work
    assert matched(idx) == 2


def test_unknown_parent_is_unresolved_not_guessed():
    idx, ap = setup()
    ap.apply(BlockStored((13,), 999, tuple(TOKENS[8:12]), BS))
    assert idx.size("w") == 0 and ap.stats.unresolved_blocks == 1


def test_clear_and_reset():
    idx, ap = setup()
    ap.apply(BlockStored((11, 12), None, tuple(TOKENS[:8]), BS))
    idx.store("w", [42], expires_at=1e9)  # a speculative entry
    ap.reset()  # gap: exact entries go, speculative stay, mapping is forgotten
    assert matched(idx) == 0 and idx.size("w") == 1
    ap.apply(BlockStored((13,), 12, tuple(TOKENS[8:12]), BS))
    assert ap.stats.unresolved_blocks == 1
    ap.apply(AllBlocksCleared())
    assert idx.size("w") == 0


def test_lora_and_cache_salt_from_extra_keys():
    idx, ap = setup()
    ap.apply(BlockStored((1, 2), None, tuple(TOKENS[:8]), BS, lora_name="ad",
                         extra_keys=(("ad", "salty"), ("ad",))))
    assert matched(idx, lora="ad", salt="salty") == 2
    assert matched(idx) == 0 and matched(idx, lora="ad") == 0


def test_multimodal_blocks_end_the_chain():
    idx, ap = setup()
    ap.apply(BlockStored((1, 2), None, tuple(TOKENS[:8]), BS, extra_keys=(None, (("img", 0),))))
    assert matched(idx) == 1 and ap.stats.unresolved_blocks == 1
    ap.apply(BlockStored((5,), None, tuple(TOKENS[:4]), BS, extra_keys=((("img", 0),),)))
    assert ap.stats.unresolved_blocks == 2


def test_other_media_and_groups_are_ignored():
    idx, ap = setup()
    ap.apply(BlockStored((1,), None, tuple(TOKENS[:4]), BS, medium="CPU"))
    ap.apply(BlockStored((1,), None, tuple(TOKENS[:4]), BS, group_idx=1))
    assert idx.size("w") == 0 and ap.stats.ignored_events == 2


def test_observed_block_size_and_multi_model():
    idx = PrefixIndex(100)
    idx.add_worker("w")
    ap = EventApplier("w", ["m", "alias"], idx, 100)
    ap.apply(BlockStored((1,), None, tuple(TOKENS[:8]), 8))
    assert ap.observed_block_size == 8
    for model in ("m", "alias"):
        assert idx.match({"w": block_hashes(TOKENS, 8, root_hash(model))}, now=0)["w"] == 1


def test_trtllm_json_shape():
    body = [
        {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [512, 0]}, "window_size": 32},
        {"event_id": 1, "data": {"type": "stored", "parent_hash": None, "blocks": [
            {"type": "stored_block", "block_hash": 77, "cache_level": 0, "priority": 35,
             "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in TOKENS[:4]]},
            {"type": "stored_block", "block_hash": 78, "cache_level": 0, "priority": 35,
             "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in TOKENS[4:8]]},
        ]}, "window_size": 32},
        {"event_id": 2, "data": {"type": "updated", "block_hash": 77,
                                 "cache_level": {"type": "event_diff", "new_value": 1, "old_value": 0}}},
        {"event_id": 3, "data": {"type": "removed", "block_hashes": [78]}, "window_size": 32},
    ]
    items = decode_trtllm_events(body)
    assert [i for i, _ in items] == [0, 1, 2, 3]
    assert items[0][1] == 512 and items[2][1] is None
    idx, ap = setup()
    ap.apply(items[1][1])
    assert matched(idx) == 2
    ap.apply(items[3][1])
    assert matched(idx) == 1
    with pytest.raises(EventDecodeError):
        decode_trtllm_events({"not": "a list"})
