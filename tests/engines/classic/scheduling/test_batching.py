"""The pure batch-forming and queue-policy logic, driven with plain objects and a fake clock."""

from __future__ import annotations

import pytest

from engines.classic.scheduling.batching import BatcherConfig, BatchQueue, QueueFull, QueuePolicy

MS = 1_000_000  # ns


def _queue(**kw) -> BatchQueue:
    base = {"max_batch_size": 8, "dynamic": True, "max_queue_delay_us": 1000}
    base.update(kw)
    return BatchQueue(BatcherConfig(**base))


def _push(q: BatchQueue, name: str, now_ns: int = 0, size: int = 1, key=(), priority: int = 0, timeout_us: int = 0):
    return q.push(name, size, key, priority, timeout_us, now_ns)


def test_waits_for_delay_then_runs_everything():
    q = _queue()
    for i in range(3):
        _push(q, f"r{i}")
    decision = q.form_batch(0)
    assert decision.entries == [] and decision.wait_until_ns == 1 * MS
    decision = q.form_batch(1 * MS)
    assert [e.item for e in decision.entries] == ["r0", "r1", "r2"] and len(q) == 0


def test_full_batch_runs_immediately_and_respects_max():
    q = _queue(max_batch_size=4)
    for i in range(6):
        _push(q, f"r{i}")
    assert [e.item for e in q.form_batch(0).entries] == ["r0", "r1", "r2", "r3"]
    assert len(q) == 2


def test_zero_delay_runs_what_is_there():
    q = _queue(max_queue_delay_us=0)
    _push(q, "a")
    assert [e.item for e in q.form_batch(0).entries] == ["a"]


def test_preferred_batch_size_trims_and_triggers():
    q = _queue(preferred_batch_sizes=(2, 4), max_queue_delay_us=10_000)
    for i in range(5):
        _push(q, f"r{i}")
    assert [e.item for e in q.form_batch(0).entries] == ["r0", "r1", "r2", "r3"]


def test_incompatible_shapes_are_not_batched_and_not_reordered():
    q = _queue()
    _push(q, "a", key=("x", 3))
    _push(q, "b", key=("x", 5))
    _push(q, "c", key=("x", 3))
    assert [e.item for e in q.form_batch(0).entries] == ["a"]  # blocked by b: runs now
    assert [e.item for e in q.form_batch(0).entries] == ["b"]


def test_request_batch_sizes_count_rows():
    q = _queue(max_batch_size=8)
    _push(q, "a", size=5)
    _push(q, "b", size=4)
    assert [e.item for e in q.form_batch(0).entries] == ["a"]


def test_priority_levels_order_and_default():
    q = _queue(priority_levels=3, default_priority_level=2, max_queue_delay_us=0, max_batch_size=1)
    _push(q, "low", priority=3)
    _push(q, "default", priority=0)
    _push(q, "high", priority=1)
    _push(q, "out_of_range", priority=9)  # treated as the default level
    order = [q.form_batch(0).entries[0].item for _ in range(4)]
    assert order == ["high", "default", "out_of_range", "low"]


def test_max_queue_size_rejects():
    q = _queue(default_policy=QueuePolicy(max_queue_size=2))
    _push(q, "a")
    _push(q, "b")
    with pytest.raises(QueueFull, match="Exceeds maximum queue size"):
        _push(q, "c")


def test_per_level_queue_policy():
    q = _queue(priority_levels=2, default_priority_level=2, level_policies={1: QueuePolicy(max_queue_size=1)})
    _push(q, "a", priority=1)
    with pytest.raises(QueueFull):
        _push(q, "b", priority=1)
    _push(q, "c", priority=2)  # the other level is unbounded


def test_default_timeout_rejects_and_reports_deadline():
    q = _queue(default_policy=QueuePolicy(default_timeout_us=500), max_queue_delay_us=10_000)
    _push(q, "a", now_ns=0)
    assert q.next_deadline_ns() == 500_000
    assert q.expire(499_999) == []
    assert [e.item for e in q.expire(500_000)] == ["a"] and len(q) == 0


def test_request_timeout_shortens_default_unless_override_allowed():
    assert QueuePolicy(default_timeout_us=1000).timeout_us(5000) == 1000
    assert QueuePolicy(default_timeout_us=1000).timeout_us(10) == 10
    assert QueuePolicy(default_timeout_us=1000, allow_timeout_override=True).timeout_us(5000) == 5000
    assert QueuePolicy().timeout_us(7) == 7
    assert QueuePolicy(default_timeout_us=5, reject_on_timeout=False).timeout_us(0) == 5


def test_delay_action_never_rejects():
    q = _queue(default_policy=QueuePolicy(default_timeout_us=1, reject_on_timeout=False))
    _push(q, "a")
    assert q.expire(10 * MS) == [] and q.next_deadline_ns() is None


def test_non_dynamic_runs_one_request_per_execution():
    q = BatchQueue(BatcherConfig(max_batch_size=8))
    _push(q, "a")
    _push(q, "b")
    assert [e.item for e in q.form_batch(0).entries] == ["a"]


def test_config_validation():
    with pytest.raises(ValueError):
        BatcherConfig(max_batch_size=-1)
    with pytest.raises(ValueError):
        BatcherConfig(max_batch_size=1, priority_levels=2, default_priority_level=3)
    with pytest.raises(ValueError):
        QueuePolicy(max_queue_size=-1)
