"""Suite-wide debugging aid: `kill -USR1 <pytest pid>` prints every asyncio task's stack
to stderr (and `kill -USR2` every thread's), to diagnose a hung test without killing it.

And the rule that only tests marked `integration` start servers (tests/server_guard.py), and
httpx's module-level calls without a timeout of their own get a patient one (tests/http_timeouts.py)."""

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield from server_guard.track(item)
