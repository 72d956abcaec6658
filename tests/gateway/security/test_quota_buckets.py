"""Quota arithmetic on a hand-driven clock (the store's decisions, no I/O)."""

from __future__ import annotations

from gateway.security.keys import Limits
from gateway.security.quota_buckets import LocalQuotas


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rpm_allows_a_burst_then_the_steady_rate() -> None:
    clock = Clock()
    q = LocalQuotas(clock)
    limits = Limits(rpm=3)
    assert [q.admit("k", limits, count=True, hold=False) for _ in range(3)] == [None] * 3
    refusal = q.admit("k", limits, count=True, hold=False)
    assert refusal is not None and refusal.reason == "rpm" and abs(refusal.retry_after_s - 20.0) < 1e-6
    clock.now += 20.0
    assert q.admit("k", limits, count=True, hold=False) is None
    assert q.admit("other", limits, count=True, hold=False) is None  # keys do not share buckets


def test_concurrency_slots_and_release() -> None:
    q = LocalQuotas(Clock())
    limits = Limits(concurrency=2, rpm=100)
    assert q.admit("k", limits, count=True, hold=True) is None
    assert q.admit("k", limits, count=True, hold=True) is None
    refusal = q.admit("k", limits, count=True, hold=True)
    assert refusal is not None and refusal.reason == "concurrency"
    q.release("k")
    assert q.in_use("k") == 1 and q.admit("k", limits, count=True, hold=True) is None


def test_a_refused_slot_spends_no_request() -> None:
    q = LocalQuotas(Clock())
    limits = Limits(concurrency=1, rpm=2)
    assert q.admit("k", limits, count=True, hold=True) is None
    assert q.admit("k", limits, count=True, hold=True).reason == "concurrency"  # type: ignore[union-attr]
    q.release("k")
    assert q.admit("k", limits, count=True, hold=False) is None  # the refusal above cost nothing


def test_tokens_reserve_debt_and_refund() -> None:
    clock = Clock()
    q = LocalQuotas(clock)
    assert q.reserve_tokens("k", 60, 40) is None
    q.charge_tokens("k", 60, 50)  # the completion overdraws: 90 of 60
    refusal = q.reserve_tokens("k", 60, 10)
    assert refusal is not None and refusal.reason == "tpm" and abs(refusal.retry_after_s - 40.0) < 1e-6
    q.charge_tokens("k", 60, -80)  # refund
    assert q.reserve_tokens("k", 60, 10) is None
    clock.now += 120
    assert q.reserve_tokens("k", 60, 60) is None  # drained: a full minute's budget at once
