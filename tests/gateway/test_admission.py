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
