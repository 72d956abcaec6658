"""A python model instance in its own process: `parameters { key: "isolation" value { string_value: "process" } }`.

The server's side of `stub.py`, which holds the protocol. Like Triton's stub
processes, and with the same model code and `pb_utils`:
- Tensors go through two shared-memory segments this object owns (inputs, outputs),
  grown by replacement when a batch needs more; the socket carries JSON metadata.
- A crash of the process (a segfault, `os._exit`, anything that ends it) fails only
  the batch it was running, with INTERNAL; the next batch starts a new process,
  which runs `initialize()` again.
- A batch past the time limit kills the process (SIGKILL) and fails with
  UNAVAILABLE; the next batch starts a new process. So here the limit is hard, and
  the scheduler does not abandon this instance (`enforces_time_limit`).
- What the process may reach is `sandbox.py`'s: an allow-listed environment (no keys), a
  session of its own that is killed whole (grandchildren too) on a timeout, a crash or a
  close, optionally another user (`--python-model-user`), and only the segments it is handed.
- Every call blocks; it runs on the instance's own thread, never on the event loop.
- BLS is refused inside the process, with a message saying so.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import engines
from engines.classic.errors import ConfigError, InferError
from engines.classic.execution.backends import sandbox, shm
from engines.classic.execution.backends.base import Backend, ComputeTimes, model_file
from engines.classic.proto import ModelConfig
from engines.classic.repository.config import to_json
from engines.errors import ErrorKind

if TYPE_CHECKING:
    from engines.classic.request import InferRequest

log = logging.getLogger("sluice.classic")
# Where the `engines` package lives, for the child's imports (its parent, never `engines/` itself:
# that would make engines/transformers shadow the transformers library in the model's code).
_ROOT = Path(engines.__file__).resolve().parent.parent
_INIT_TIMEOUT_S = 600.0  # initialize() may load weights; a hung one still ends
_FIRST_SEGMENT_BYTES = 1 << 20
_MAX_REPLY_BYTES = 64 << 20  # metadata only: a reply this large is a broken process
_MAX_OUTPUT_BYTES = 4 << 30  # one batch's outputs; a process asking for more is treated as broken
_PYTHON = sys.executable  # the model user must be able to run it and read its packages


class _Lost(Exception):
    """The process died, hung past the limit, or broke the protocol: kill it, fail the batch."""

    def __init__(self, message: str, kind: ErrorKind) -> None:
        super().__init__(message)
        self.message, self.kind = message, kind


class IsolatedPythonBackend(Backend):
    enforces_time_limit = True

    def __init__(self, config: ModelConfig, version_dir: Path, index: int, time_limit_s: float,
                 user: str | None = None) -> None:
        super().__init__(config)
        model_file(config, version_dir, "model.py")  # a file outside the model is refused before any spawn
        try:
            self._user = None if user is None else sandbox.resolve_user(user)
        except ValueError as exc:
            raise ConfigError(f"model '{config.name}': {exc}") from None
        self._init = {"op": "init", "config": to_json(config), "version_dir": str(version_dir), "index": index}
        self._limit_s = time_limit_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._sock: socket.socket | None = None
        self._in = shm.Segment.create(_FIRST_SEGMENT_BYTES)
        self._out = shm.Segment.create(_FIRST_SEGMENT_BYTES)
        try:
            self._spawn()
        except BaseException:
            self._release()
            raise

    # ---- the process -------------------------------------------------------------------------
    def _spawn(self) -> None:
        """Start the process and run initialize(); raises ConfigError with the model's reason."""
        ours, theirs = socket.socketpair()
        user = self._user
        env = sandbox.child_env(os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH")) if p), user)
        try:
            self._proc = subprocess.Popen([_PYTHON, "-m", "engines.classic.execution.backends.stub",
                                           str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                          stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                          user=user.uid if user else None, group=user.gid if user else None,
                                          extra_groups=[] if user else None)
        except OSError as exc:  # e.g. the model user may not run the interpreter
            ours.close()
            who = f" as user {user.name}" if user else ""
            raise ConfigError(f"model '{self.config.name}' (isolation 'process'): cannot start {_PYTHON}{who}: "
                              f"{exc.strerror or exc}") from None
        finally:
            theirs.close()
        self._sock = ours
        self._conn = Connection(os.dup(ours.fileno()))
        try:
            self._send(self._init)
            reply = self._recv(time.monotonic() + _INIT_TIMEOUT_S, "initialize()")
        except _Lost as exc:
            self._kill()
            raise ConfigError(f"model '{self.config.name}' (isolation 'process'): {exc.message}") from None
        if "error" in reply:
            self._kill()
            raise ConfigError(f"model '{self.config.name}' (isolation 'process'): {reply['error']}")
        log.info("model %s: instance process %d started", self.config.name, self._proc.pid)

    def _kill(self) -> None:
        if self._proc is not None:
            sandbox.kill_tree(self._proc.pid)  # its process group: what the model started dies with it
            self._proc.wait()
        if self._conn is not None:
            self._conn.close()
        if self._sock is not None:
            self._sock.close()
        self._proc = self._conn = self._sock = None

    def _status(self) -> str:
        if self._proc is None:
            return "not running"
        code = sandbox.exit_status(self._proc.pid, 5.0)  # not reaped: `_kill` still kills its group
        if code is None:
            return "not responding"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"

    def _send(self, message: dict[str, Any], segments: tuple[shm.Segment, ...] = ()) -> None:
        assert self._conn is not None and self._sock is not None  # only called with a running process
        try:
            self._conn.send_bytes(json.dumps(message).encode())
            if segments:
                shm.send(self._sock, list(segments))
        except OSError:
            raise _Lost(f"model '{self.config.name}': its process exited ({self._status()})",
                        ErrorKind.INTERNAL) from None

    def _recv(self, deadline: float | None, what: str) -> dict[str, Any]:
        assert self._conn is not None
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            if not self._conn.poll(remaining):
                raise _Lost(f"model '{self.config.name}' {what} exceeded its time limit of "
                            f"{self._limit_s if what == 'execute()' else _INIT_TIMEOUT_S:g} s; its process was "
                            "killed and is restarted", ErrorKind.UNAVAILABLE)
            reply = json.loads(self._conn.recv_bytes(_MAX_REPLY_BYTES))
        except (EOFError, OSError):
            raise _Lost(f"model '{self.config.name}': its process exited ({self._status()}) during {what}; it is "
                        "restarted", ErrorKind.INTERNAL) from None
        except ValueError:
            raise _Lost(f"model '{self.config.name}': its process sent a malformed reply", ErrorKind.INTERNAL) from None
        if not isinstance(reply, dict):
            raise _Lost(f"model '{self.config.name}': its process sent a malformed reply", ErrorKind.INTERNAL)
        return reply

    # ---- execute ----------------------------------------------------------------------------
    def execute(self, requests: list[InferRequest]) -> list[dict[str, np.ndarray] | InferError]:
        if self._proc is None:
            try:
                self._spawn()
            except ConfigError as exc:
                return [InferError(f"its process could not be restarted: {exc}", ErrorKind.UNAVAILABLE)] * len(requests)
        try:
            return self._run(requests)
        except _Lost as exc:
            log.error("%s", exc.message)
            self._kill()
            self.timings = ComputeTimes()
            return [InferError(exc.message, exc.kind)] * len(requests)

    def _run(self, requests: list[InferRequest]) -> list[dict[str, np.ndarray] | InferError]:
        encoded = [shm.encode(r.inputs) for r in requests]
        size = sum(shm.packed_size(e) for e in encoded)
        if size > self._in.size:
            self._in = self._grown(self._in, size)
        offset, sent = 0, []
        for request, tensors in zip(requests, encoded, strict=True):
            metas, offset = shm.pack(tensors, self._in, offset)
            sent.append({"inputs": metas, "outputs": request.outputs, "batch_size": request.batch_size,
                         "parameters": request.parameters, "id": request.request_id,
                         "priority": request.priority, "timeout": request.timeout_us})
        deadline = time.monotonic() + self._limit_s if self._limit_s else None
        self._send({"op": "execute", "input": self._in.describe(), "output": self._out.describe(),
                    "requests": sent}, (self._in, self._out))
        reply = self._recv(deadline, "execute()")
        if "need" in reply:
            need = int(reply["need"])
            if not 0 < need <= _MAX_OUTPUT_BYTES:
                raise _Lost(f"model '{self.config.name}': its outputs need {need} bytes, more than the "
                            f"{_MAX_OUTPUT_BYTES} one batch may return", ErrorKind.INTERNAL)
            self._out = self._grown(self._out, need)
            self._send({"op": "grow", "output": self._out.describe()}, (self._out,))
            reply = self._recv(deadline, "execute()")
        return self._results(reply, len(requests))

    def _results(self, reply: dict[str, Any], count: int) -> list[dict[str, np.ndarray] | InferError]:
        try:
            answers = reply["results"]
            if len(answers) != count:
                raise ValueError(f"{len(answers)} results for {count} requests")
            results: list[dict[str, np.ndarray] | InferError] = [
                InferError(str(a["error"]), ErrorKind(a["kind"])) if "error" in a
                else shm.unpack(a["outputs"], self._out, copy=True) for a in answers]
            self.timings = ComputeTimes(*(int(t) for t in reply["timings"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise _Lost(f"model '{self.config.name}': its process sent a malformed reply ({exc})",
                        ErrorKind.INTERNAL) from None
        return results

    def _grown(self, old: shm.Segment, size: int) -> shm.Segment:
        try:
            new = shm.Segment.create(max(size, 2 * old.size))
        except OSError as exc:  # /dev/shm is full: this batch fails, the process starts clean
            raise _Lost(f"model '{self.config.name}': no shared memory for {size} bytes: {exc}",
                        ErrorKind.UNAVAILABLE) from None
        old.close()  # the process may still map it until it maps the new one; the memory goes with the last
        return new

    # ---- close ------------------------------------------------------------------------------
    def close(self) -> None:
        if self._proc is not None and self._conn is not None:
            try:
                self._send({"op": "close"})
                sandbox.exit_status(self._proc.pid, 10.0)  # then `_kill` ends what it left running
            except _Lost:
                pass
        self._kill()
        self._release()

    def _release(self) -> None:
        for segment in (self._in, self._out):
            segment.close()
