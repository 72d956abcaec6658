"""The gateway's store of responses: bounds, expiry and who may read a record (no Redis here;
tests/integration/vllm_pair/test_redis_replicas.py shares records through a real one)."""

from __future__ import annotations

import time

import pytest

from gateway.response_store import ResponseStore, Stored


def record(rid: str, owner: str = "key-a", size: int = 10) -> Stored:
    return Stored(id=rid, owner=owner, response={"id": rid}, input_items=[], root=rid,
                  conversation=[{"role": "user", "content": "x" * size}])


async def test_a_record_is_visible_only_to_its_key_and_can_be_deleted_by_it() -> None:
    store = ResponseStore()
    assert await store.put(record("r1"))
    assert (await store.get("r1", "key-a")).conversation[0]["content"] == "x" * 10
    assert await store.get("r1", "key-b") is None and await store.get("r1", "") is None
    assert not await store.delete("r1", "key-b") and await store.get("r1", "key-a") is not None
    assert await store.delete("r1", "key-a") and await store.get("r1", "key-a") is None


async def test_count_and_bytes_bounds_drop_the_oldest() -> None:
    store = ResponseStore(max_count=3, max_bytes=10_000)
    for i in range(5):
        await store.put(record(f"r{i}"))
    assert len(store) == 3 and await store.get("r0", "key-a") is None and await store.get("r4", "key-a")
    by_bytes = ResponseStore(max_count=100, max_bytes=8000)
    for i in range(16):  # ~670 bytes each
        await by_bytes.put(record(f"b{i}", size=500))
    assert by_bytes.bytes <= 8000 and await by_bytes.get("b15", "key-a") and await by_bytes.get("b0", "key-a") is None
    assert not await by_bytes.put(record("huge", size=2000))  # over an eighth of the bound: not kept
    assert await by_bytes.get("huge", "key-a") is None


async def test_records_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    store = ResponseStore(ttl_s=60)
    await store.put(record("r1"))
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + 61)
    assert await store.get("r1", "key-a") is None and len(store) == 0 and store.bytes == 0
