"""Only tests marked `integration` may start a server, so that `pytest -m "not integration"` stays a
fast loop. Self-enforcing: while a test runs, starting a server from it raises at once, naming the
test, unless the test (or its module) carries the mark.

What counts as starting a server: a subprocess of `sluice serve` or `sluice worker` (the console
script, or `python -m gateway.cli`; only the subcommand, the token right after it, decides), of an
engine launcher or the sim engine (`python -m engines...`), of a stand-in worker
(`tests/standins/*.py`), of uvicorn, redis-server, prometheus, node or Chromium, also when a shell
runs it (`sh -c "..."`, as `shell=True` does); and uvicorn serving in this process. Other
subprocesses (a CLI that writes files, promtool, kubectl, openssl) do not count, nor does an asyncio
socket server a unit test opens in its own event loop as a fake peer.

`tests/conftest.py` installs it: `track` runs around every test; `install` adds the checks.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

_SERVER_PROGRAMS = frozenset({"redis-server", "prometheus", "node", "chromium", "chrome", "headless_shell",
                              "chrome-headless-shell", "uvicorn"})
_SHELLS = frozenset({"sh", "bash", "dash", "zsh"})
_SERVING_SUBCOMMANDS = ("serve", "worker")
# What may stand before a shell command's program: `exec redis-server`, `env X=1 node app.js`.
_PREFIXES = frozenset({"exec", "env", "nohup", "command"})
_running: pytest.Item | None = None


def starts_server(argv: Sequence[str]) -> bool:
    """Whether the command line `argv` starts one of the servers above."""
    if not argv:
        return False
    program = os.path.basename(argv[0])
    if program in _SERVER_PROGRAMS:
        return True
    if program in _SHELLS:
        return any(starts_server(command) for command in _shell_commands(argv))
    if program == "sluice":
        return len(argv) > 1 and argv[1] in _SERVING_SUBCOMMANDS
    for i, arg in enumerate(argv[:-1]):
        if arg != "-m":
            continue
        module, subcommand = argv[i + 1], argv[i + 2] if i + 2 < len(argv) else ""
        if module in ("uvicorn", "engines.launchers") or module.startswith("engines.sim"):
            return True
        if module == "gateway.cli" and subcommand in _SERVING_SUBCOMMANDS:
            return True
    return any(a.endswith(".py") and os.sep + "standins" + os.sep in a for a in argv)


def _shell_commands(argv: Sequence[str]) -> list[list[str]]:
    """The simple commands of the script a shell runs with `-c SCRIPT` (`-ec`, `-lc` too), each
    without the variable assignments and `exec`-like words before its program; [] without `-c`."""
    script = next((argv[i + 1] for i in _options(argv) if "c" in argv[i][1:] and i + 1 < len(argv)), None)
    if script is None:
        return []
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True  # words as the shell splits them; `;&|()` still end a command
    try:
        words = list(lexer)
    except ValueError:  # unbalanced quotes: the shell fails too, but look at the words anyway
        words = script.split()
    commands: list[list[str]] = [[]]
    for word in words:
        if word and all(c in ";&|()" for c in word):
            commands.append([])
        elif commands[-1] or not ("=" in word or word in _PREFIXES):
            commands[-1].append(word)
    return [c for c in commands if c]


def _options(argv: Sequence[str]) -> Iterator[int]:
    """The indexes of a shell's short-option words, up to its first operand (a script file)."""
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--" or not arg.startswith("-"):
            return  # the operands start
        if not arg.startswith("--"):  # a long option (--norc) takes no part
            yield i


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
    if len(argv) == 1:  # a command line as one string
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
