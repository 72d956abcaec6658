"""Admission control decisions (pure, one event loop)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.llm.admission import Admission, AdmissionConfig, QueueFull


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
