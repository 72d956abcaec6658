"""Admission control decisions (pure, one event loop)."""

from __future__ import annotations

import asyncio

import pytest

from engines.errors import ErrorKind
from gateway.llm.admission import Admission, AdmissionConfig, Claim, QueueFull
from gateway.llm.admission.gate import DEFAULT_ANSWER_TOKENS


async def test_running_then_queued_then_refused() -> None:
    a = Admission(AdmissionConfig(max_running=1, max_queued=1))
    first = a.try_admit()
    second = a.try_admit()
    assert first.admitted and not second.admitted
    with pytest.raises(QueueFull):
        a.try_admit()
    first.release()
    await asyncio.wait_for(second.wait(), 1)
    assert second.admitted and a.running == 1 and a.queued == 0
    second.release()
    second.release()  # idempotent
    assert a.running == 0


async def test_fifo_and_abandoned_waiters_free_their_place() -> None:
    a = Admission(AdmissionConfig(max_running=1, max_queued=3))
    holder = a.try_admit()
    w1, w2, w3 = a.try_admit(), a.try_admit(), a.try_admit()
    w2.release()  # client went away while queued
    assert a.queued == 2
    holder.release()
    assert w1.admitted and not w3.admitted
    w1.release()
    assert w3.admitted


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        AdmissionConfig(max_running=0)
    with pytest.raises(ValueError):
        AdmissionConfig(max_queued=-1)


async def test_fan_out_counts_as_its_engine_requests() -> None:
    """n=4 takes 4 of the model's slots: with 6 slots, a second n=4 request waits, and it is
    woken before a later small request that would fit (arrival order, no starvation)."""
    a = Admission(AdmissionConfig(max_running=6, max_queued=8))
    wide = a.try_admit(4)
    assert wide.admitted and a.running == 4
    second = a.try_admit(4)
    small = a.try_admit(1)
    assert not second.admitted and not small.admitted and a.queued == 5
    with pytest.raises(QueueFull):
        a.try_admit(4)  # 5 + 4 engine requests would exceed the 8 queue places
    wide.release()
    assert second.admitted and small.admitted and a.running == 5 and a.queued == 0


def test_a_request_wider_than_the_model_takes_all_of_it() -> None:
    a = Admission(AdmissionConfig(max_running=2, max_queued=0))
    t = a.try_admit(10)
    assert t.admitted and a.running == 2
    with pytest.raises(QueueFull):
        a.try_admit(1)


def claim(tenant: str, klass: int = 1, deadline_s: float | None = None, weight: float = 1.0) -> Claim:
    return Claim(tenant, weight, klass, deadline_s)


async def test_a_flood_does_not_take_the_queue_from_another_tenant() -> None:
    a = Admission(AdmissionConfig(max_running=1, max_queued=4))
    events: list[tuple[str, str]] = []
    a.observer = lambda event, c, value: events.append((event, c.tenant))
    running = a.try_admit(1, claim("flood"), tokens=10)
    flood = [a.try_admit(1, claim("flood"), tokens=10) for _ in range(4)]
    quiet = a.try_admit(1, claim("quiet"), tokens=10)  # the queue is full: the flood's newest leaves
    assert flood[-1].error is not None and flood[-1].error.code == "queue_full"
    assert ("refused:evicted", "flood") in events
    running.release(10)  # served what it was charged
    await asyncio.wait_for(quiet.wait(), 1)  # next, ahead of the flood's older waiters
    assert quiet.admitted and not any(t.admitted for t in flood)


async def test_fcfs_order_refuses_the_newcomer_instead() -> None:
    a = Admission(AdmissionConfig(max_running=1, max_queued=2, fair=False))
    a.try_admit(1, claim("flood"))
    a.try_admit(1, claim("flood"))
    a.try_admit(1, claim("flood"))
    with pytest.raises(QueueFull):
        a.try_admit(1, claim("quiet"))


async def test_a_queued_request_leaves_when_its_deadline_passes() -> None:
    a = Admission(AdmissionConfig(max_running=1, max_queued=4))
    events: list[str] = []
    a.observer = lambda event, c, value: events.append(event)
    holder = a.try_admit(1, claim("a"))
    late = a.try_admit(1, claim("b", deadline_s=0.05))
    patient = a.try_admit(1, claim("c"))
    await asyncio.wait_for(late.wait(), 2)
    assert not late.admitted and late.error is not None and late.error.kind is ErrorKind.DEADLINE
    assert late.error.code == "deadline_exceeded" and late.error.retry_after_s is not None
    assert "refused:deadline_expired" in events and a.queued == 1
    holder.release(0)
    await asyncio.wait_for(patient.wait(), 1)
    assert patient.admitted


async def test_settlement_and_the_expected_answer_follow_what_was_served() -> None:
    a = Admission(AdmissionConfig(max_running=2, max_queued=2))
    assert a.expected_answer("a", 1000) == DEFAULT_ANSWER_TOKENS and a.expected_answer("a", 10) == 10
    t = a.try_admit(1, claim("a"), tokens=100 + DEFAULT_ANSWER_TOKENS, prompt_tokens=100)
    t.release(56)  # served 156 tokens, was charged 356: 200 given back
    assert a.queue.counters["a"] == 156.0
    assert a.answers["a"].value == 56.0 and a.hold_s is not None
    assert a.expected_answer("newcomer", 1000) == 56.0  # a new tenant is expected to answer like the others


async def test_predicted_wait_counts_the_slots_ahead_at_the_hold_rate() -> None:
    a = Admission(AdmissionConfig(max_running=2, max_queued=8))
    assert a.predicted_wait_s(claim("x")) == 0.0  # a free slot
    held = [a.try_admit(1, claim("a")) for _ in range(2)]
    queued = [a.try_admit(1, claim("a")) for _ in range(3)]
    assert a.predicted_wait_s(claim("a")) == 0.0  # no hold time learnt yet: no basis to refuse on
    a.hold_s = 4.0
    # 2 running + 3 ahead + itself - 2 slots = 4 slots to turn over, 2 every 4 s.
    assert a.predicted_wait_s(claim("a")) == 8.0
    assert a.predicted_wait_s(claim("i", klass=0)) == 2.0  # interactive: only the running ones
    for t in held + queued:
        t.release(0)
