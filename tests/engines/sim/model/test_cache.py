"""The sim's KV block pool: capacity, LRU eviction of unreferenced blocks, prefix matches."""

from __future__ import annotations

import pytest

from engines.sim.model.cache import BlockCache
from engines.sim.model.kv_events import AllBlocksCleared, BlockRemoved


def test_allocation_is_bounded_by_capacity() -> None:
    cache = BlockCache(num_blocks=4, block_size=16)
    got = cache.allocate(3)
    assert len(set(got)) == 3 and cache.num_free == 1 and cache.usage == 0.75
    assert not cache.can_allocate(2)
    with pytest.raises(ValueError, match="2 blocks asked for, 1 free"):
        cache.allocate(2)


def test_committed_blocks_are_matched_as_a_prefix_only() -> None:
    cache = BlockCache(4, 16)
    a, b, c = cache.allocate(3)
    cache.commit(a, 101)
    cache.commit(b, 102)
    cache.commit(c, 103)
    assert cache.match([101, 102, 103]) == [a, b, c]
    assert cache.match([101, 999, 103]) == [a]  # a chain stops at its first miss
    assert cache.match([999, 102]) == []


def test_blocks_in_use_are_never_evicted() -> None:
    cache = BlockCache(2, 16)
    held = cache.allocate(2)
    for i, block in enumerate(held):
        cache.commit(block, 200 + i)
    assert not cache.can_allocate(1)  # both are referenced: nothing to evict
    assert cache.match([200, 201]) == held


def test_unreferenced_blocks_stay_cached_until_evicted_least_recently_freed_first() -> None:
    cache = BlockCache(4, 16)
    first = cache.allocate(2)
    second = cache.allocate(2)
    for block, h in zip(first + second, (1, 2, 3, 4), strict=True):
        cache.commit(block, h)
    cache.release(first)  # freed first: evicted first
    cache.release(second)
    assert cache.num_free == 4 and cache.num_cached == 4 and cache.usage == 0.0
    assert cache.match([1, 2]) == first  # still hits after release
    cache.take_events()
    cache.allocate(1)
    # A request's blocks are freed tail first, so its last block goes before its first.
    assert cache.take_events() == [BlockRemoved((2,))]
    assert cache.match([1]) == [first[0]] and cache.match([1, 2]) == [first[0]]
    cache.allocate(1)
    assert cache.take_events() == [BlockRemoved((1,))]
    assert cache.match([3, 4]) == second


def test_a_prefix_hit_takes_a_free_block_out_of_the_eviction_queue() -> None:
    cache = BlockCache(2, 16)
    a, b = cache.allocate(2)
    cache.commit(a, 7)
    cache.commit(b, 8)
    cache.release([a, b])
    cache.acquire([a])  # a later request reuses block a
    assert cache.can_allocate(1) and not cache.can_allocate(2)
    assert cache.can_allocate(0, reusing=[b]) and not cache.can_allocate(1, reusing=[b])
    cache.allocate(1)
    assert cache.take_events() == [BlockRemoved((8,))]
    assert cache.match([7]) == [a] and cache.ref_count(a) == 1


def test_a_duplicate_hash_keeps_the_first_copy() -> None:
    cache = BlockCache(3, 16)
    a, b = cache.allocate(2)
    cache.commit(a, 5)
    cache.commit(b, 5)  # the recomputed last block of a prompt of whole blocks
    assert cache.match([5]) == [a] and cache.num_cached == 1
    cache.release([b])
    cache.allocate(2)  # hands out the unused block and b: evicting b announces nothing
    assert cache.take_events() == []


def test_reset_clears_only_an_idle_cache() -> None:
    cache = BlockCache(2, 16)
    (a,) = cache.allocate(1)
    cache.commit(a, 9)
    assert not cache.reset()
    cache.release([a])
    assert cache.reset() and cache.match([9]) == []
    assert cache.take_events() == [AllBlocksCleared()]


def test_releasing_too_often_is_an_error() -> None:
    cache = BlockCache(2, 16)
    (a,) = cache.allocate(1)
    cache.release([a])
    with pytest.raises(ValueError, match="released more often"):
        cache.release([a])
