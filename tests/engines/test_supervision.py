"""The supervision policy on plain objects: backoff bounds, restarts of a failing loop, and the
engine supervisor's sequence (fail in-flight once, restart until it works, count it).

Time is not waited for: `sleep` is injected and records the delays asked for. The engine
here is a STAND-IN (a flag for "alive" and a scripted restart); the real transformers
engine is supervised in tests/gateway/llm/test_engine_restart.py.
"""

from __future__ import annotations

import asyncio

import pytest

from engines.supervision import QUICK_BACKOFF, BackgroundTask, Backoff, Restarts
from engines.transformers.supervisor import EngineSupervisor


class Sleeps:
    """Records requested delays; each one yields to the loop once instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay_s: float) -> None:
        self.delays.append(delay_s)
        await asyncio.sleep(0)


def test_backoff_doubles_up_to_its_bound() -> None:
    b = Backoff(initial_s=0.5, max_s=4.0)
    assert [b.delay_s(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.delay_s(10_000) == 4.0
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(initial_s=2.0, max_s=1.0)


def test_a_quick_backoff_restarts_at_once_then_grows_tenfold() -> None:
    assert [QUICK_BACKOFF.delay_s(n) for n in range(1, 6)] == [0.01, 0.1, 1.0, 1.0, 1.0]


def test_restarts_count_in_a_row_until_a_run_lasted_long_enough() -> None:
    r = Restarts(Backoff(initial_s=1.0, max_s=8.0, reset_after_s=10.0))
    r.started(0.0)
    assert [r.failed(1.0), r.failed(1.5)] == [1.0, 2.0]  # the failed attempt counts too
    r.restarted(2.0)
    assert r.failed(3.0) == 4.0  # a crash soon after the restart continues the count
    r.restarted(4.0)
    assert r.failed(14.0) == 1.0 and r.in_a_row == 1  # ten healthy seconds start it over
    assert r.total == 2


async def test_a_failing_loop_is_logged_counted_and_restarted_with_growing_delays(caplog) -> None:
    runs: list[int] = []
    restarted: list[str] = []
    sleeps = Sleeps()
    forever = asyncio.Event()

    async def loop() -> None:
        runs.append(len(runs))
        if len(runs) <= 2:
            raise RuntimeError(f"boom {len(runs)}")
        if len(runs) == 3:
            return  # a loop that ends on its own is a failure too
        await forever.wait()

    task = BackgroundTask("health-w0", loop, backoff=Backoff(initial_s=1.0, max_s=3.0),
                          on_restart=lambda: restarted.append("health-w0"), sleep=sleeps)
    task.start()
    for _ in range(100):
        if len(runs) == 4:
            break
        await asyncio.sleep(0)
    assert len(runs) == 4
    assert restarted == ["health-w0"] * 3 and task.restarts.total == 3
    assert sleeps.delays == [1.0, 2.0, 3.0]
    assert "boom 1" in caplog.text and "health-w0 returned" in caplog.text
    await task.stop()
    assert len(runs) == 4  # stopped: not restarted again


async def test_a_crash_is_cleaned_up_before_the_restart_even_if_the_clean_up_raises(caplog) -> None:
    crashes: list[str] = []
    runs: list[int] = []
    forever = asyncio.Event()

    def on_crash(exc: Exception) -> None:
        crashes.append(str(exc))
        raise ValueError("the clean-up itself failed")

    async def loop() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise RuntimeError("boom")
        await forever.wait()

    task = BackgroundTask("scheduler", loop, backoff=QUICK_BACKOFF, on_crash=on_crash, sleep=Sleeps())
    task.start()
    await _until(lambda: len(runs) == 2, "restarted")
    assert crashes == ["boom"] and task.restarts.total == 1
    assert "cleaning up after background task scheduler failed" in caplog.text
    await task.stop()


class EngineStandIn:
    """A STAND-IN engine: `alive` is its generation loop; restarts fail `fail_restarts` times."""

    def __init__(self, fail_restarts: int) -> None:
        self.alive = True
        self.fail_restarts = fail_restarts
        self.in_flight = 3
        self.failed_with: list[str] = []
        self.restart_calls = 0

    def loop_alive(self) -> bool:
        return self.alive

    def fail_in_flight(self, reason: str) -> int:
        self.failed_with.append(reason)
        n, self.in_flight = self.in_flight, 0
        return n

    async def restart(self) -> None:
        self.restart_calls += 1
        if self.restart_calls <= self.fail_restarts:
            raise RuntimeError("warm-up failed")
        self.alive = True


async def _until(cond, what: str) -> None:
    for _ in range(2000):  # bounded: only loop turns, no real waiting
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


async def test_engine_supervisor_fails_in_flight_once_and_retries_the_restart_with_backoff() -> None:
    engine = EngineStandIn(fail_restarts=2)
    sleeps = Sleeps()
    sup = EngineSupervisor("m", engine, backoff=Backoff(initial_s=0.5, max_s=30.0), poll_s=0.01, sleep=sleeps)
    sup.start()
    try:
        await _until(lambda: len(sleeps.delays) >= 3, "watching")
        assert sup.restarts == 0 and not sup.down
        sleeps.delays.clear()
        engine.alive = False
        await _until(lambda: sup.restarts == 1, "restarted")
        assert len(engine.failed_with) == 1 and "restarting" in engine.failed_with[0]
        assert engine.restart_calls == 3
        # Watch polls (0.01) are interleaved; the restart delays double per failed attempt.
        assert [d for d in sleeps.delays if d != 0.01] == [0.5, 1.0, 2.0]
        assert not sup.down
        # A crash soon after the restart continues the count: the next delay is longer still.
        sleeps.delays.clear()
        engine.alive = False
        await _until(lambda: sup.restarts == 2, "restarted again")
        assert [d for d in sleeps.delays if d != 0.01] == [4.0]
        assert len(engine.failed_with) == 2
    finally:
        await sup.stop()
