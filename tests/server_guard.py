"""Only tests marked `integration` may start a server, so that `pytest -m "not integration"` stays a
fast loop. Self-enforcing: while a test runs, starting a server from it raises at once, naming the
test, unless the test (or its module) carries the mark.

What counts as starting a server: a subprocess of `sluice serve` or `sluice worker`, of an engine
launcher or the sim engine (`python -m engines...`), of a stand-in worker (`tests/standins/*.py`),
of uvicorn, redis-server, prometheus, node or Chromium; and uvicorn serving in this process. Other
subprocesses (a CLI that writes files, promtool, kubectl, openssl) do not count, nor does an asyncio
socket server a unit test opens in its own event loop as a fake peer.

`tests/conftest.py` installs it: `track` runs around every test; `install` adds the checks.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

_SERVER_PROGRAMS = frozenset({"redis-server", "prometheus", "node", "chromium", "chrome", "headless_shell",
                              "chrome-headless-shell", "uvicorn"})
_running: pytest.Item | None = None


def starts_server(argv: Sequence[str]) -> bool:
    """Whether the command line `argv` starts one of the servers above."""
    if not argv:
        return False
    if os.path.basename(argv[0]) in _SERVER_PROGRAMS:
        return True
    modules = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"]
    if any(m in ("uvicorn", "engines.launchers") or m.startswith("engines.sim") for m in modules):
        return True
    if "gateway.cli" in modules and any(a in ("serve", "worker") for a in argv):
        return True
    return any(a.endswith(".py") and os.sep + "standins" + os.sep in a for a in argv)


def check(what: str) -> None:
    """Raise unless no test is running or the running one is marked `integration`."""
    item = _running
    if item is not None and item.get_closest_marker("integration") is None:
        raise RuntimeError(f"{item.nodeid} starts a server ({what}) but is not marked integration: "
                           "add `pytestmark = pytest.mark.integration` (tests/server_guard.py)")


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen" or _running is None:
        return
    argv = args[1]
    argv = [argv] if isinstance(argv, (str, bytes, os.PathLike)) else list(argv or ())
    argv = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in argv]
    if len(argv) == 1:  # a shell string
        argv = argv[0].split()
    if starts_server(argv):
        check(" ".join(argv)[:200])


def install() -> None:
    sys.addaudithook(_audit)
    try:
        import uvicorn
    except ImportError:
        return
    startup = uvicorn.Server.startup

    async def guarded(self: uvicorn.Server, sockets: Any = None) -> None:
        check("uvicorn in this process")
        await startup(self, sockets)

    uvicorn.Server.startup = guarded  # type: ignore[method-assign]


def track(item: pytest.Item) -> Iterator[None]:
    """Around one test's setup, call and teardown: it is the running one."""
    global _running
    _running = item
    try:
        yield
    finally:
        _running = None
