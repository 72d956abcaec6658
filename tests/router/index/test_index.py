from __future__ import annotations

import math

import pytest

from router.index.prefix_index import EXACT, PrefixIndex


def make() -> PrefixIndex:
    idx = PrefixIndex(max_blocks_per_worker=100)
    idx.add_worker("a")
    idx.add_worker("b")
    return idx


def test_longest_prefix_per_worker():
    idx = make()
    idx.store("a", [1, 2, 3])
    idx.store("b", [1, 2])
    assert idx.match({"a": [1, 2, 3, 4], "b": [1, 2, 3, 4]}, now=0) == {"a": 3, "b": 2}


def test_hole_ends_the_match():
    idx = make()
    idx.store("a", [1, 3])
    assert idx.match({"a": [1, 2, 3]}, now=0) == {"a": 1}


def test_speculative_expires_and_exact_is_never_downgraded():
    idx = make()
    idx.store("a", [1, 2], expires_at=10.0)
    assert idx.match({"a": [1, 2]}, now=5) == {"a": 2}
    assert idx.match({"a": [1, 2]}, now=10) == {"a": 0}
    idx.store("a", [1], expires_at=EXACT)
    idx.store("a", [1], expires_at=20.0)  # a later speculative store must not downgrade it
    assert idx.match({"a": [1]}, now=1e9) == {"a": 1}


def test_remove_and_speculative_only_remove():
    idx = make()
    idx.store("a", [1])
    idx.store("a", [2], expires_at=100.0)
    assert idx.remove("a", [1, 2], speculative_only=True) == 1
    assert idx.match({"a": [1]}, now=0) == {"a": 1}
    assert idx.remove("a", [1, 99]) == 1
    assert idx.size("a") == 0


def test_clear_exact_only_keeps_speculative():
    idx = make()
    idx.store("a", [1])
    idx.store("a", [2], expires_at=100.0)
    idx.clear("a", exact_only=True)
    assert list(idx.entries("a")) == [(2, 100.0)]
    idx.clear("a")
    assert idx.size("a") == 0


def test_lru_bound_evicts_least_recently_stored():
    idx = PrefixIndex(max_blocks_per_worker=3)
    idx.add_worker("a")
    idx.store("a", [1, 2, 3])
    idx.store("a", [1])  # touch 1: now 2 is the oldest
    idx.store("a", [4])
    assert [h for h, _ in idx.entries("a")] == [3, 1, 4]
    assert idx.evictions == 1


def test_capacity_models_approximate_lru():
    idx = PrefixIndex(max_blocks_per_worker=100)
    idx.add_worker("a", capacity_blocks=2)
    idx.store("a", [1, 2, 3], expires_at=1e9)
    assert idx.match({"a": [1, 2, 3]}, now=0) == {"a": 0}  # block 1 was evicted
    assert idx.match({"a": [2, 3]}, now=0) == {"a": 2}
    with pytest.raises(ValueError):
        idx.set_capacity("a", 0)


def test_unknown_worker_is_ignored_and_prune_drops_expired():
    idx = make()
    assert idx.store("zz", [1]) == []
    idx.store("a", [1, 2], expires_at=1.0)
    idx.store("a", [3])
    assert idx.prune(now=2.0) == 2
    assert list(idx.entries("a")) == [(3, math.inf)]


def test_store_reports_new_hashes():
    idx = make()
    assert idx.store("a", [1, 2]) == [1, 2]
    assert idx.store("a", [2, 3]) == [3]
