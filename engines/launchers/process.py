"""Supervise one engine server process: spawn, wait for health, forward signals, stop.

The child runs in its own session, so a terminal's Ctrl-C reaches only us and we
decide how to stop it: SIGTERM first (vLLM and trtllm-serve shut their engine
processes down on it), SIGKILL to the whole group after `stop_timeout_s`.

The engine also dies with us when we cannot stop it (SIGKILL, an OOM kill): on Linux it is
started with a parent-death signal (SIGTERM), so no orphaned engine goes on holding its port
or, on a GPU node, its GPU memory. SIGTERM rather than SIGKILL, so vLLM still takes its own
engine-core processes down with it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

import httpx

log = logging.getLogger(__name__)

_HEALTH_POLL_S = 1.0


class EngineProcess:
    """A started engine server; `stop()` is idempotent and returns its exit code."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        log.info("starting engine: %s", " ".join(self.argv))
        self.proc = subprocess.Popen(self.argv, env=env, start_new_session=True,
                                     preexec_fn=_dies_with(os.getpid()) if sys.platform == "linux" else None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait_healthy(self, health_url: str, timeout_s: float, stop: threading.Event | None = None) -> bool:
        """Poll `health_url` until 200; False if the process exits, `stop` is set, or time runs out."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.poll() is not None or (stop is not None and stop.is_set()):
                    return False
                try:
                    if client.get(health_url).status_code == 200:
                        return True
                except httpx.HTTPError:
                    pass  # not listening yet
                if stop is not None:
                    stop.wait(_HEALTH_POLL_S)
                else:
                    time.sleep(_HEALTH_POLL_S)
        return False

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then SIGKILL the process group after `timeout_s`; returns the exit code."""
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("engine pid %d ignored SIGTERM for %.0f s; killing it", self.pid, timeout_s)
                self._signal_group(signal.SIGKILL)
                self.proc.wait()
        # Engine helpers (vLLM's engine core) may outlive a killed parent; reap the group.
        self._signal_group(signal.SIGKILL)
        return self.proc.returncode

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


_PR_SET_PDEATHSIG = 1


def _dies_with(parent: int) -> Callable[[], None]:
    """Run in the child between fork and exec: ask the kernel for SIGTERM when `parent` dies.
    The signal follows the thread that forked, so `EngineProcess` is made on the main thread."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def arm() -> None:
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            os.write(2, b"sluice worker: prctl(PR_SET_PDEATHSIG) failed; the engine may outlive its launcher\n")
        if os.getppid() != parent:  # the launcher died before the signal was armed
            os._exit(1)
    return arm


class StopSignal:
    """Turns SIGTERM/SIGINT into an Event for the supervising loop (main thread only)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignal:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, _frame: object) -> None:
        self.signum = signum
        self.event.set()
