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

What must read the same from any frontend is asked of all of them (`gateway.frontends.channel`): metrics
and statistics. What must agree is shared on the node: LLM routing state
(`router.replicas.node_state`), per-key quotas (`gateway.security.node_quotas`) and worker
registrations (`gateway.frontends.registrations`). What cannot stay consistent across copies is
refused when the server starts: explicit model control (a load or unload would reach one
process), model uploads, in-process LLMs (each frontend would load the weights; serve them from
workers), port 0, and running as a worker that registers itself with a gateway.

The supervisor checks that the ports are free (a plain bind: frontends left running by a
killed supervisor would otherwise share them unnoticed), then starts the frontends in their
own session, each set to get SIGTERM if the supervisor dies. It restarts a frontend that
dies, after a back-off of its own (`engines.supervision.Backoff`), and gives up (stopping the
others, exit 1) when a frontend dies `_MAX_DEATHS` times in `_DEATH_WINDOW_S`, or fails its
start-up before any frontend was ever ready (a configuration error: every restart would fail
alike). SIGTERM and SIGINT are passed on once to every frontend, and each stops as a single
server does (SIGTERM: drain; SIGINT: at once); whatever still runs `stop_timeout_s` later is
killed. The supervisor exits 0 when all have stopped cleanly.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from types import FrameType

from engines.supervision import Backoff, die_with_parent

log = logging.getLogger("sluice.frontends")
STARTUP_FAILED = 3  # a frontend's exit status when its start-up failed
_MAX_DEATHS, _DEATH_WINDOW_S = 5, 60.0
_BACKOFF = Backoff(initial_s=0.5, max_s=30.0, reset_after_s=_DEATH_WINDOW_S)
_ENV_INDEX, _ENV_DIR, _ENV_PARENT = "SLUICE_FRONTEND_INDEX", "SLUICE_FRONTEND_DIR", "SLUICE_FRONTEND_PARENT"
_ENV_STARTED = "SLUICE_FRONTEND_STARTED"  # the supervisor's start (Unix time): every model's `created`
_CLEAN_EXITS = (0, -signal.SIGTERM, -signal.SIGINT)


def check_ports_free(host: str, ports: list[int]) -> None:
    """Raise ValueError when a port is already bound (without SO_REUSEPORT, as a stray server's would share)."""
    for port in ports:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as e:
                raise ValueError(f"port {port} on {host} is in use ({e.strerror}): another server, or frontends "
                                 "left running by a supervisor that was killed") from None


def check_no_local_llms(repository: Path | None, served: tuple[str, ...], workers_only: bool) -> None:
    """Raise ValueError when the repository holds LLMs that each frontend would load in-process
    (checked before any frontend starts; a frontend checks again once its repository is parsed)."""
    if repository is None or workers_only:
        return
    from engines.classic.errors import ConfigError
    from engines.classic.repository.config import load_config
    from engines.classic.repository.disk import model_dirs

    names = []
    for name, model_dir in sorted(model_dirs(repository).items()):
        try:
            if load_config(model_dir).backend == "llm" and (not served or name in served):
                names.append(name)
        except (ConfigError, OSError):
            continue  # a broken config is reported by the frontends, as by a single server
    if names:
        raise ValueError(local_llms_refused(names))


def local_llms_refused(names: list[str]) -> str:
    return (f"every frontend would load its own copy of LLM(s) {', '.join(sorted(names))}; serve them from a "
            "worker (`sluice worker`, then --worker), or serve a repository without LLMs")


class Supervisor:
    def __init__(self, argv: list[str], count: int, stop_timeout_s: float) -> None:
        self._argv, self._count = [sys.executable, "-m", "gateway.cli", *argv], count
        self._stop_timeout_s = stop_timeout_s
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._deaths: dict[int, deque[float]] = {i: deque() for i in range(count)}
        self._signalled: set[int] = set()  # pids the stop signal was sent to
        self._stop: tuple[int, float] | None = None  # the signal, and when to kill what is left
        self._dir = Path(tempfile.mkdtemp(prefix="sluice-frontends-"))  # mode 0700
        self._started = str(int(time.time()))

    def _start(self, index: int) -> None:
        if self._stop is not None:
            return
        (self._dir / f"ready-{index}").unlink(missing_ok=True)
        env = {**os.environ, _ENV_INDEX: str(index), _ENV_DIR: str(self._dir), _ENV_PARENT: str(os.getpid()),
               _ENV_STARTED: self._started}
        proc = subprocess.Popen(self._argv, env=env, start_new_session=True)  # Ctrl-C reaches us only
        self._procs[index] = proc
        log.info("frontend %d started (pid %d)", index, proc.pid)
        if self._stop is not None:  # the stop signal came while it was being created
            self._pass_on(proc, self._stop[0])

    def _pass_on(self, proc: subprocess.Popen[bytes], signum: int) -> None:
        if proc.pid not in self._signalled and proc.poll() is None:
            self._signalled.add(proc.pid)
            proc.send_signal(signum)

    def _signal(self, signum: int, _frame: FrameType | None) -> None:
        if self._stop is None:
            self._stop = (signum, time.monotonic() + self._stop_timeout_s)
        for proc in list(self._procs.values()):
            self._pass_on(proc, self._stop[0])

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
            shutil.rmtree(self._dir, ignore_errors=True)

    def _watch(self) -> int:
        restarts: dict[int, float] = {}  # frontend -> when it may start again
        ready_seen = False  # some frontend has been ready: a start-up failure after that is transient
        while True:
            now = time.monotonic()
            ready_seen = ready_seen or any(self._dir.glob("ready-*"))
            if self._stop is not None:
                if all(p.poll() is not None for p in self._procs.values()):
                    codes = [p.returncode for p in self._procs.values()]
                    return 0 if all(c in _CLEAN_EXITS for c in codes) else 1
                if now > self._stop[1]:
                    log.error("frontends still running %.0f s after the stop signal; killing them",
                              self._stop_timeout_s)
                    for proc in self._procs.values():
                        if proc.poll() is None:
                            proc.kill()
                time.sleep(0.1)
                continue
            for index, proc in list(self._procs.items()):
                if index in restarts:
                    if now >= restarts[index]:
                        del restarts[index]
                        self._start(index)
                    continue
                code = proc.poll()
                if code is None:
                    continue
                if code == STARTUP_FAILED and not ready_seen:
                    log.error("frontend %d failed its start-up; stopping the others", index)
                    return self._give_up()
                deaths = self._deaths[index]
                deaths.append(now)
                while deaths and now - deaths[0] > _DEATH_WINDOW_S:
                    deaths.popleft()
                if len(deaths) >= _MAX_DEATHS:
                    log.error("frontend %d died %d times in %.0f s; stopping", index, len(deaths), _DEATH_WINDOW_S)
                    return self._give_up()
                delay = _BACKOFF.delay_s(len(deaths))
                log.error("frontend %d (pid %d) exited with status %d; restarting it in %.1f s",
                          index, proc.pid, code, delay)
                restarts[index] = now + delay
            time.sleep(0.1)

    def _give_up(self) -> int:
        self._signal(signal.SIGTERM, None)
        for proc in self._procs.values():
            try:
                proc.wait(max(0.1, self._stop[1] - time.monotonic()) if self._stop else 30.0)
            except subprocess.TimeoutExpired:
                proc.kill()
        return 1


_FRONTEND: tuple[int, Path] | None = None
_STARTED: int | None = None
_READ = False


def frontend_env() -> tuple[int, Path] | None:
    """In a frontend: its index and the siblings' socket directory (None in a single server).
    Read once, then taken out of the environment, so processes it starts are not frontends."""
    global _FRONTEND, _STARTED, _READ
    if not _READ:
        _READ = True
        index, directory = os.environ.pop(_ENV_INDEX, None), os.environ.pop(_ENV_DIR, None)
        parent, started = os.environ.pop(_ENV_PARENT, None), os.environ.pop(_ENV_STARTED, None)
        if index is not None and directory is not None:
            _FRONTEND = int(index), Path(directory)
            _STARTED = int(started) if started else None
            die_with_parent(signal.SIGTERM)  # a supervisor that dies takes its frontends with it
            if parent is not None and os.getppid() != int(parent):  # it died before that was set
                os.kill(os.getpid(), signal.SIGTERM)
    return _FRONTEND


def frontend_started() -> int | None:
    """In a frontend: when its supervisor started (Unix time), which every frontend reports as its
    models' `created`, so that `/v1/models` reads the same from each; None in a single server."""
    frontend_env()
    return _STARTED


def mark_ready(frontend: tuple[int, Path]) -> None:
    """Tell the supervisor this frontend became ready once (a later start-up failure is then transient)."""
    (frontend[1] / f"ready-{frontend[0]}").touch()
