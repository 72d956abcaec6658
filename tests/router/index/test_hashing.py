from __future__ import annotations

import pytest

from router.index.hashing import block_hashes, cacheable_blocks, chain_hash, rendezvous_score, root_hash


def test_chain_covers_only_full_blocks_and_is_prefix_stable():
    root = root_hash("m")
    a = block_hashes(list(range(300)), 128, root)
    b = block_hashes(list(range(256)) + [9] * 50, 128, root)
    assert len(a) == 2 and a == b  # tail beyond the last full block does not matter
    assert block_hashes(list(range(127)), 128, root) == []


def test_chain_is_chained_not_per_block():
    root = root_hash("m")
    x = block_hashes([1] * 4 + [2] * 4, 4, root)
    y = block_hashes([3] * 4 + [2] * 4, 4, root)
    assert x[1] != y[1]  # same second block, different first block
    assert x[1] == chain_hash(x[0], [2] * 4)


def test_salts_separate_model_lora_and_cache_salt():
    toks = list(range(64))
    roots = {root_hash("m"), root_hash("m2"), root_hash("m", "lora"), root_hash("m", None, "s"),
             root_hash("m", "", None), root_hash("m", None, "")}
    assert len(roots) == 6  # None and "" differ too
    hs = {block_hashes(toks, 16, r)[0] for r in roots}
    assert len(hs) == 6


def test_block_size_changes_keys():
    root = root_hash("m")
    assert block_hashes(list(range(32)), 16, root)[0] != block_hashes(list(range(32)), 32, root)[0]


@pytest.mark.parametrize("bad", [[-1], [2**32]])
def test_rejects_out_of_range_tokens(bad):
    with pytest.raises(ValueError):
        block_hashes(bad * 4, 4, root_hash("m"))


def test_rejects_bad_block_size():
    with pytest.raises(ValueError):
        block_hashes([1, 2], 0, root_hash("m"))


def test_cacheable_blocks_keeps_last_token_uncached():
    assert cacheable_blocks(256, 2, 128) == 1  # exactly 2 blocks: the last one is recomputed
    assert cacheable_blocks(257, 2, 128) == 2
    assert cacheable_blocks(401, 5, 128) == 3  # the measured vLLM case: 384 cached of 401
    assert cacheable_blocks(0, 3, 128) == 0


def test_rendezvous_is_deterministic_and_spreads():
    workers = ["w0", "w1", "w2"]
    firsts = {max(workers, key=lambda w: rendezvous_score(k, w)) for k in range(100)}
    assert firsts == set(workers)
    assert rendezvous_score("k", "w0") == rendezvous_score("k", "w0")
