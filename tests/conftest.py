"""Suite-wide debugging aid: `kill -USR1 <pytest pid>` prints every asyncio task's stack
to stderr (and `kill -USR2` every thread's), to diagnose a hung test without killing it.

And the rule that only tests marked `integration` start servers (tests/server_guard.py), and
httpx's module-level calls without a timeout of their own get a patient one (tests/http_timeouts.py).

And the order and grouping of work when pytest-xdist runs the suite (`make test`: `-n` workers,
`--dist loadgroup --no-loadscopereorder`): see `pytest_collection_modifyitems`."""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys
from collections.abc import Iterator

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


# Rank of a module's work, costliest first: the modules on the session's shared vLLM pair (one unit),
# then those starting their own vLLM workers or marked slow, then other servers, then unit tests.
_SHARED_VLLM, _OWN_VLLM, _SERVERS, _UNIT = range(4)


def _rank(items: list[pytest.Item]) -> int:
    if any("workers" in item.fixturenames and item.get_closest_marker("vllm") for item in items):
        return _SHARED_VLLM
    if any(item.get_closest_marker("vllm") or item.get_closest_marker("slow") for item in items):
        return _OWN_VLLM
    return _SERVERS if any(item.get_closest_marker("integration") for item in items) else _UNIT


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test module is one unit of work for pytest-xdist's `loadgroup` (its module-scoped
    servers start once, in one worker), and all modules on the shared vLLM pair (`workers` in
    tests/integration/conftest.py) are one unit, so one worker starts that pair. Units run costliest
    first (`_rank`, a stable sort), so the long ones do not start last and leave a worker idle.
    Without xdist the order is the same and the marks do nothing."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    rank = {path: _rank(module) for path, module in modules.items()}
    for path, module in modules.items():
        group = "shared-vllm-pair" if rank[path] == _SHARED_VLLM else path
        for item in module:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield from server_guard.track(item)
