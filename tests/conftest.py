"""Suite-wide debugging aid: `kill -USR1 <pytest pid>` prints every asyncio task's stack
to stderr (and `kill -USR2` every thread's), to diagnose a hung test without killing it.

And the rule that only tests marked `integration` start servers (tests/server_guard.py), and
httpx's module-level calls without a timeout of their own get a patient one (tests/http_timeouts.py).

And the order and grouping of work when pytest-xdist runs the suite (`make test`: `-n` workers,
`--dist loadscope --no-loadscope-reorder`): see `pytest_collection_modifyitems` and
`pytest_xdist_make_scheduler`; and the longer time bound of vLLM tests."""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests import http_timeouts, server_guard


def _dump_tasks(signum: int, frame: object) -> None:
    for loop in {t.get_loop() for t in _all_tasks()}:
        print(f"--- asyncio tasks on {loop!r}", file=sys.stderr)
    for task in _all_tasks():
        print(f"--- {task!r}", file=sys.stderr)
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


def _all_tasks() -> set[asyncio.Task]:
    try:
        return asyncio.all_tasks(asyncio.get_event_loop_policy().get_event_loop())
    except RuntimeError:
        return set()


faulthandler.register(signal.SIGUSR2, all_threads=True)
signal.signal(signal.SIGUSR1, _dump_tasks)


server_guard.install()
http_timeouts.install()


# The tests on the session's shared pair of vLLM workers: one unit of work, so one xdist worker starts the pair.
SHARED_VLLM_DIR = "tests/integration/vllm_pair/"
# A vLLM test's bound (its setup may start vLLM workers: up to STARTUP_TIMEOUT_S each, vllm_support.py),
# above pytest-timeout's 300 s for the rest.
VLLM_TIMEOUT_S = 1200
# Rank of a module's work, costliest first: the shared vLLM pair's folder, then modules starting their own
# vLLM workers or marked slow, then other servers, then unit tests.
_SHARED_VLLM, _OWN_VLLM, _SERVERS, _UNIT = range(4)


def _unit(nodeid: str) -> str:
    """A test's unit of work under xdist: its module, or the shared vLLM pair's folder."""
    path = nodeid.split("::", 1)[0]
    return SHARED_VLLM_DIR if path.startswith(SHARED_VLLM_DIR) else path


def _rank(unit: str, items: list[pytest.Item]) -> int:
    if unit == SHARED_VLLM_DIR:
        return _SHARED_VLLM
    if any(item.get_closest_marker("vllm") or item.get_closest_marker("slow") for item in items):
        return _OWN_VLLM
    return _SERVERS if any(item.get_closest_marker("integration") for item in items) else _UNIT


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Units of work (`_unit`) run costliest first (`_rank`, a stable sort), so under xdist the long
    ones do not start last and leave a worker idle; without xdist the order is the same. A test on the
    shared vLLM pair outside its folder is refused: another xdist worker would start a second pair.
    vLLM tests get VLLM_TIMEOUT_S unless they set their own."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(_unit(item.nodeid), []).append(item)
        if "workers" in item.fixturenames and _unit(item.nodeid) != SHARED_VLLM_DIR and item.get_closest_marker("vllm"):
            raise pytest.UsageError(f"{item.nodeid} uses the shared vLLM pair: move it under {SHARED_VLLM_DIR}")
        if item.get_closest_marker("vllm") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(VLLM_TIMEOUT_S))
    rank = {unit: _rank(unit, unit_items) for unit, unit_items in units.items()}
    items.sort(key=lambda item: rank[_unit(item.nodeid)])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With `--dist loadscope` (make test): each module is one unit of work, so its module-scoped
    servers start once, in one worker; the shared vLLM pair's folder is one unit. (xdist's own
    `loadgroup` marks do nothing under pytest 9, which no longer derives a node id from `_nodeid`.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return ModuleScheduling(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield from server_guard.track(item)
