"""`sluice serve --frontends N`: N server processes on one set of ports, and their supervisor.

One Python process spends most of a classic request in protocol work (HTTP or gRPC framing,
protobuf, the event loop), and holds one GIL while it does: it cannot use a second core for
it. With `--frontends N` this process becomes a supervisor and starts N copies of the same
`sluice serve` command, the frontends, each told its index in the environment. Each opens
the HTTP, gRPC and metrics ports with SO_REUSEPORT once its models are ready, so the kernel
spreads new connections over the frontends that are ready, and none is sent to one still
loading. Each frontend loads the repository and runs its own batchers and instances: a
batch is formed from the requests that reached that process, with no hop between processes
on the hot path.

What must read the same from any frontend is asked of all of them (`gateway.peers`): metrics
and statistics. What cannot stay consistent across copies is refused when the server starts:
explicit model control (a load or unload would reach one process), model uploads,
in-process LLMs (each frontend would load the weights; serve them from workers), per-key
quotas without Redis (each process would grant the whole quota), port 0, worker registration.

The supervisor restarts a frontend that dies, after a back-off, and gives up (stopping the
others, exit 1) when one fails its start-up or dies `_MAX_DEATHS` times in `_DEATH_WINDOW_S`.
SIGTERM is passed on to every frontend, each drains as a single server does, and the
supervisor exits 0 when all have; a second SIGTERM or a SIGINT is passed on the same way.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from types import FrameType

log = logging.getLogger("sluice.frontends")
STARTUP_FAILED = 3  # a frontend's exit status when its start-up failed: a restart would fail the same way
_MAX_DEATHS, _DEATH_WINDOW_S = 5, 60.0
_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
_ENV_INDEX, _ENV_DIR = "SLUICE_FRONTEND_INDEX", "SLUICE_FRONTEND_DIR"


class Supervisor:
    def __init__(self, argv: list[str], count: int) -> None:
        self._argv, self._count = [sys.executable, "-m", "gateway.cli", *argv], count
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._deaths: deque[float] = deque()
        self._stopping = False
        self._dir = Path(tempfile.mkdtemp(prefix="sluice-frontends-"))  # mode 0700

    def _start(self, index: int) -> None:
        env = {**os.environ, _ENV_INDEX: str(index), _ENV_DIR: str(self._dir)}
        self._procs[index] = subprocess.Popen(self._argv, env=env)
        log.info("frontend %d started (pid %d)", index, self._procs[index].pid)

    def _signal(self, signum: int, _frame: FrameType | None) -> None:
        self._stopping = True
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._signal)
        log.info("%d frontends sharing the ports", self._count)
        for index in range(self._count):
            self._start(index)
        try:
            return self._watch()
        finally:
            for proc in self._procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for path in self._dir.iterdir():
                path.unlink(missing_ok=True)
            self._dir.rmdir()

    def _watch(self) -> int:
        restarts: dict[int, float] = {}  # frontend -> when it may start again
        while True:
            if self._stopping and all(p.poll() is not None for p in self._procs.values()):
                return 0
            now = time.monotonic()
            for index, proc in list(self._procs.items()):
                if index in restarts:
                    if now >= restarts[index] and not self._stopping:
                        del restarts[index]
                        self._start(index)
                    continue
                code = proc.poll()
                if code is None or self._stopping:
                    continue
                if code == STARTUP_FAILED:
                    log.error("frontend %d failed its start-up; stopping the others", index)
                    return self._give_up()
                self._deaths.append(now)
                while self._deaths and now - self._deaths[0] > _DEATH_WINDOW_S:
                    self._deaths.popleft()
                if len(self._deaths) >= _MAX_DEATHS:
                    log.error("frontends died %d times in %.0f s; stopping", len(self._deaths), _DEATH_WINDOW_S)
                    return self._give_up()
                delay = _BACKOFF_S[min(len(self._deaths) - 1, len(_BACKOFF_S) - 1)]
                log.error("frontend %d (pid %d) exited with status %d; restarting it in %.1f s",
                          index, proc.pid, code, delay)
                restarts[index] = now + delay
            time.sleep(0.1)

    def _give_up(self) -> int:
        self._signal(signal.SIGTERM, None)
        deadline = time.monotonic() + 30.0
        for proc in self._procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        return 1


def frontend_env() -> tuple[int, Path] | None:
    """In a frontend: its index and the siblings' socket directory (None in a single server)."""
    index, directory = os.environ.get(_ENV_INDEX), os.environ.get(_ENV_DIR)
    if index is None or directory is None:
        return None
    return int(index), Path(directory)
