"""Triton's rate limiter (engines/classic/execution/rate_limiter.py): its books alone, and two real
python models sharing one resource in an in-process ModelRepositoryManager."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import numpy as np
import pytest

from engines.classic import ModelRepositoryManager
from engines.classic.errors import ConfigError
from engines.classic.execution.rate_limiter import RateLimiter, Requirement, parse_resources
from engines.classic.limits import ClassicLimits

ONE_R = Requirement((("R", 1),), 1)


def _rounds(limiter: RateLimiter, needs: dict[str, Requirement], rounds: int, order: list[str] | None = None
            ) -> dict[str, int]:
    """Every model always has work, as a driver with a full queue: each round all ask, the one granted
    runs (charge), asks at once for its next batch (it waits: the unit is held), and finishes."""
    granted = dict.fromkeys(needs, 0)
    for _ in range(rounds):
        winners = [k for k in needs if limiter.acquire(k, needs[k], lambda: None)]
        assert len(winners) == 1, winners  # one unit of R: exactly one may run
        limiter.charge(winners[0], needs[winners[0]])
        assert not limiter.acquire(winners[0], needs[winners[0]], lambda: None)
        granted[winners[0]] += 1
        if order is not None:
            order.append(winners[0])
        limiter.release(needs[winners[0]])
    return granted


def test_an_instance_of_priority_2_gets_half_the_turns_of_one_of_priority_1() -> None:
    limiter = RateLimiter()
    needs = {"fast": Requirement((("R", 1),), 1), "slow": Requirement((("R", 1),), 2)}
    limiter.register("m", list(needs.values()), "test")
    granted = _rounds(limiter, needs, 300)
    assert granted == {"fast": 200, "slow": 100}


def test_an_idle_instance_does_not_bank_turns() -> None:
    limiter = RateLimiter()
    needs = {"a": ONE_R, "b": ONE_R}
    limiter.register("m", [ONE_R], "test")
    _rounds(limiter, {"a": ONE_R}, 50)  # a ran alone for a while; b was idle
    order: list[str] = []
    assert _rounds(limiter, needs, 100, order) == {"a": 50, "b": 50}
    assert "bbb" not in "".join(order), order  # b does not take a run of turns for having been idle


def test_capacity_is_the_flags_or_the_most_one_instance_asks() -> None:
    limiter = RateLimiter()
    limiter.register("a", [Requirement((("R", 2),))], "a")
    limiter.register("b", [Requirement((("R", 3), ("S", 1)))], "b")
    assert (limiter.capacity("R"), limiter.capacity("S")) == (3, 1)
    flagged = RateLimiter({"R": 2})
    with pytest.raises(ConfigError, match="asks for 3 of rate-limiter resource 'R'"):
        flagged.register("b", [Requirement((("R", 3),))], "b")


def test_a_waiter_that_withdraws_lets_the_next_one_run() -> None:
    limiter = RateLimiter()
    limiter.register("m", [ONE_R], "test")
    woken: list[str] = []
    assert limiter.acquire("a", ONE_R, lambda: woken.append("a"))
    limiter.charge("a", ONE_R)
    assert not limiter.acquire("b", ONE_R, lambda: woken.append("b"))
    assert not limiter.acquire("c", ONE_R, lambda: woken.append("c"))
    limiter.release(ONE_R)
    assert woken == ["b", "c"]  # both may try; b (earlier in the line) would win
    limiter.withdraw("b")  # b's queue emptied meanwhile
    assert limiter.acquire("c", ONE_R, lambda: None)


def test_resource_flags_are_parsed_and_bounded() -> None:
    assert parse_resources(["cpu:2", "gpu_mem:0", "cpu:4"]) == (("cpu", 4), ("gpu_mem", 0))
    for bad in ("cpu", ":2", "cpu:-1", "cpu:two", "cpu:2000000", "cpu:1:0"):
        with pytest.raises(ValueError, match="rate-limit resource"):
            parse_resources([bad])


SLEEPY = '''
import time
import numpy as np

class SluiceModel:
    def execute_batch(self, inputs):
        start = time.monotonic()
        time.sleep(0.02)
        n = len(inputs["X"])
        return {"START": np.full((n, 1), start), "END": np.full((n, 1), time.monotonic())}
'''


def _sleepy(repo: Path, name: str, priority: int) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(SLEEPY)
    (repo / name / "config.pbtxt").write_text(f'''
name: "{name}"
backend: "python"
max_batch_size: 1
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "START", data_type: TYPE_FP64, dims: [ 1 ] }}, {{ name: "END", data_type: TYPE_FP64, dims: [ 1 ] }} ]
instance_group [ {{ count: 2, kind: KIND_CPU,
                    rate_limiter {{ resources [ {{ name: "R", count: 1 }} ], priority: {priority} }} }} ]
''')


async def _run(tmp_path: Path, rate_limit: bool) -> list[tuple[float, float, str]]:
    """40 requests to each of two models at once; (start, end, model) of every execution, by start."""
    repo = tmp_path / ("limited" if rate_limit else "free")
    _sleepy(repo, "often", 1)
    _sleepy(repo, "seldom", 4)
    manager = ModelRepositoryManager(repo, limits=ClassicLimits(rate_limit=rate_limit))
    await manager.start()
    try:
        x = {"X": np.zeros((1, 1), np.float32)}
        calls = [manager.infer(name, "", x) for _ in range(40) for name in ("often", "seldom")]
        names = [name for _ in range(40) for name in ("often", "seldom")]
        answers = await asyncio.gather(*calls)
    finally:
        await manager.stop()
    return sorted((float(a["START"][0, 0]), float(a["END"][0, 0]), n) for a, n in zip(answers, names, strict=True))


async def test_instances_sharing_one_resource_never_overlap_and_take_turns_by_priority(tmp_path: Path) -> None:
    runs = await _run(tmp_path, rate_limit=True)
    for (_, end, _), (start, _, _) in itertools.pairwise(runs):
        assert start >= end, "two executions held the one unit of R at once"
    first = [name for _, _, name in runs[:25]]
    assert first.count("often") == 20, first  # priority 1 vs 4: four turns in five while both wait
    free = await _run(tmp_path, rate_limit=False)  # the same models without the limiter overlap
    assert any(start < end for (_, end, _), (start, _, _) in itertools.pairwise(free))


def test_the_server_flags_reach_the_manager_and_bad_ones_are_refused(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from gateway.settings import Settings

    limits = Settings(rate_limit="execution_count", rate_limit_resources=["cpu:2", "mem:0"]).classic_limits()
    manager = ModelRepositoryManager(tmp_path, limits=limits)
    assert manager.rate_limiter is not None and manager.rate_limiter.supply == {"cpu": 2, "mem": 0}
    assert ModelRepositoryManager(tmp_path).rate_limiter is None  # off by default, as in Triton
    for bad in ({"rate_limit": "always"}, {"rate_limit_resources": ["cpu:2:0"]}):
        with pytest.raises(ValidationError):
            Settings(**bad)


def test_a_model_needing_more_is_not_starved_by_many_small_ones() -> None:
    limiter = RateLimiter({"R": 2})
    big, small = Requirement((("R", 2),)), ONE_R
    limiter.register("m", [big, small], "test")
    assert limiter.acquire("s1", small, lambda: None) and limiter.acquire("s2", small, lambda: None)
    limiter.charge("s1", small)
    limiter.charge("s2", small)
    assert not limiter.acquire("big", big, lambda: None)  # both units held
    limiter.release(small)  # s1 done; it has more work, but big waits for this unit's company
    assert not limiter.acquire("s1", small, lambda: None)
    limiter.release(small)
    assert limiter.acquire("big", big, lambda: None)


async def test_a_reloaded_model_keeps_its_resources(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _sleepy(repo, "only", 1)  # the one model naming R: R's capacity comes from it alone
    manager = ModelRepositoryManager(repo, control_mode="explicit", startup_models=["only"],
                                     limits=ClassicLimits(rate_limit=True))
    await manager.start()
    try:
        x = {"X": np.zeros((1, 1), np.float32)}
        await manager.infer("only", "", x)
        await manager.load("only")  # the new version registers before the old one unregisters
        assert manager.rate_limiter is not None and manager.rate_limiter.capacity("R") == 1
        await asyncio.wait_for(manager.infer("only", "", x), 30)
    finally:
        await manager.stop()
