"""A model's capacity from its workers, the admission limits derived from it, and the limits
following it live (gateway.llm.capacity, gateway.llm.admission)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.llm.admission import Admission, AdmissionConfig, QueueFull
from gateway.llm.capacity import DEFAULT_WORKER_CAPACITY, QUEUE_FACTOR, derived_limits, frontend_share, model_capacity
from gateway.settings import Settings
from router import BreakerState, WorkerStatus


def _status(name: str, models: tuple[str, ...] = ("m",), healthy: bool = True, draining: bool = False,
            breaker: BreakerState = BreakerState.CLOSED) -> WorkerStatus:
    return WorkerStatus(name, f"http://{name}", models, "vllm", 16, healthy, draining, breaker, 0, 0, 0, False)


def test_capacity_is_the_sum_over_workers_that_take_requests() -> None:
    workers = [_status("a"), _status("b"), _status("sick", healthy=False), _status("leaving", draining=True),
               _status("broken", breaker=BreakerState.OPEN), _status("probing", breaker=BreakerState.HALF_OPEN),
               _status("other", models=("x",)), _status("unknown")]
    caps = {"a": 128, "b": 64, "sick": 500, "leaving": 500, "broken": 500, "probing": 32, "other": 500,
            "unknown": None}
    assert model_capacity("m", workers, caps) == 128 + 64 + 32 + DEFAULT_WORKER_CAPACITY
    assert model_capacity("x", workers, caps) == 500
    assert model_capacity("m", [], caps) == 0


def test_limits_are_derived_unless_given() -> None:
    assert derived_limits(512, None, None) == (512, QUEUE_FACTOR * 512)
    assert derived_limits(0, None, None) == (1, QUEUE_FACTOR)  # every worker gone: routing refuses first
    assert derived_limits(512, 64, None) == (64, QUEUE_FACTOR * 64)  # the queue follows an explicit running
    assert derived_limits(512, None, 7) == (512, 7)
    assert derived_limits(512, 64, 0) == (64, 0)


def test_settings_zero_or_absent_means_derived() -> None:
    assert Settings().admission() == AdmissionConfig(None, None)
    assert Settings(max_running=0, max_queued=0).admission() == AdmissionConfig(None, None)
    assert Settings(max_running=4096, max_queued=10).admission() == AdmissionConfig(4096, 10)
    assert Settings().max_inflight_requests is None


def test_four_workers_of_128_admit_400_at_once_and_queue_as_many_again() -> None:
    """The 64/256 global cap turned user 321 away; the derived limits follow the fleet."""
    a = Admission(AdmissionConfig(), capacity=4 * 128)
    tickets = [a.try_admit() for _ in range(400)]
    assert all(t.admitted for t in tickets) and a.running == 400
    more = [a.try_admit() for _ in range(112 + 512)]  # 112 more run, 512 wait
    assert sum(t.admitted for t in more) == 112 and a.queued == 512
    with pytest.raises(QueueFull):
        a.try_admit()


async def test_raising_capacity_admits_waiters_at_once() -> None:
    a = Admission(AdmissionConfig(), capacity=2)
    running = [a.try_admit(), a.try_admit()]
    waiting = [a.try_admit(), a.try_admit()]
    assert not any(t.admitted for t in waiting) and a.max_queued == 2
    with pytest.raises(QueueFull):
        a.try_admit()
    assert a.set_capacity(4)  # a worker came
    await asyncio.wait_for(asyncio.gather(*(t.wait() for t in waiting)), 1)
    assert a.running == 4 and a.queued == 0 and all(t.admitted for t in running)


def test_lowering_capacity_cancels_nothing() -> None:
    a = Admission(AdmissionConfig(), capacity=4)
    running = [a.try_admit() for _ in range(4)]
    assert a.set_capacity(1)  # three workers turned unhealthy
    assert a.running == 4 and all(t.admitted for t in running)
    waiter = a.try_admit()
    assert not waiter.admitted
    with pytest.raises(QueueFull):  # the queue is 1x the new capacity
        a.try_admit()
    for t in running[:3]:
        t.release()
    assert not waiter.admitted  # one still runs: the new limit holds
    running[3].release()
    assert waiter.admitted


def test_explicit_limits_ignore_capacity() -> None:
    a = Admission(AdmissionConfig(max_running=2, max_queued=1), capacity=4)
    assert (a.max_running, a.max_queued) == (2, 1)
    assert not a.set_capacity(1000)
    assert (a.max_running, a.max_queued, a.capacity) == (2, 1, 1000)


def test_the_frontends_shares_of_a_capacity_add_up_to_it() -> None:
    """--frontends N: each admits its share; the `sluice_model_capacity` samples add up to the fleet's."""
    for capacity in (0, 1, 5, 256, 257):
        for count in (1, 2, 3, 8):
            shares = [frontend_share(capacity, i, count) for i in range(count)]
            assert sum(shares) == capacity and max(shares) - min(shares) <= 1
