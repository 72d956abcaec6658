"""The process one instance of a python model runs in under `isolation: process`, like Triton's stub.

Started by `isolated.IsolatedPythonBackend` as `python -m engines.classic.execution.backends.stub FD`:
FD is its end of a socket pair to the server. It loads model.py with the in-process
python backend (so both APIs and `pb_utils` behave the same) and executes one batch
at a time. Tensors travel in shared memory (`shm.py`); only JSON metadata crosses
the socket (`multiprocessing.connection` framing). No pickle either way: the server
never unpickles what model code could have written.

Messages, server -> process:
- `{"op": "init", "config": <ModelConfig JSON>, "version_dir": str, "index": int}`
- `{"op": "execute", "input": {"id", "size"}, "output": {"id", "size"},
   "requests": [{"inputs": [meta], "outputs": [str] | null, "batch_size": int,
                 "parameters": {...}, "id": str, "priority": int, "timeout": int}]}`
- `{"op": "grow", "output": {"id", "size"}}`, the answer to `need`
- `{"op": "close"}`: finalize and exit
Process -> server:
- `{"ok": true}` or `{"error": str}` after init
- `{"results": [{"outputs": [meta]} | {"error": str, "kind": str}], "timings": [in_ns, infer_ns, out_ns]}`
- `{"need": bytes}`: the outputs do not fit the output segment; the server sends `grow`

Each `execute` is followed by the input and output segments' file descriptors, each `grow` by the
output's (`shm.send`, SCM_RIGHTS): the segments have no names a process could open by itself.

The process exits when the server closes the socket, and (on Linux) when the server
dies. BLS calls are refused with a clear error: there is no scheduler in here.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from engines.classic.errors import InferError
from engines.classic.execution.backends import pb_utils, shm
from engines.classic.execution.backends.base import Backend
from engines.classic.execution.backends.sandbox import harden_self
from engines.classic.execution.threads import describe
from engines.classic.repository.config import parse_json
from engines.classic.request import InferRequest
from engines.errors import ErrorKind
from engines.supervision import die_with_parent

BLS_UNSUPPORTED = ("BLS (InferenceRequest.exec / async_exec) is not supported in a model with isolation "
                   "'process'; run the model in-process to call other models")


def send(conn: Connection, message: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(message, default=_jsonable).encode())


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


class _Segments:
    """The server's segments, as it hands them over with each message that names them; one already mapped
    is not mapped again, and a replaced one is unmapped once the next is mapped."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._by_role: dict[str, shm.Segment] = {}

    def receive(self, roles: dict[str, dict[str, Any]]) -> None:
        for (role, desc), fd in zip(roles.items(), shm.receive(self._sock, len(roles)), strict=True):
            current = self._by_role.get(role)
            if current is not None and current.id == desc["id"]:
                os.close(fd)
                continue
            if current is not None:
                current.close()
            self._by_role[role] = shm.Segment.attach(fd, desc)

    def __getitem__(self, role: str) -> shm.Segment:
        return self._by_role[role]


def _requests(config_name: str, msg: dict[str, Any], segment: shm.Segment) -> list[InferRequest]:
    return [InferRequest(config_name, "", shm.unpack(r["inputs"], segment, copy=False), r["outputs"],
                         int(r["priority"]), int(r["timeout"]), str(r["id"]), dict(r["parameters"]),
                         batch_size=int(r["batch_size"]))
            for r in msg["requests"]]


def _execute(conn: Connection, backend: Backend, msg: dict[str, Any], segments: _Segments) -> None:
    segments.receive({"input": msg["input"], "output": msg["output"]})
    requests = _requests(backend.config.name, msg, segments["input"])
    try:
        results = backend.execute(requests)
    except BaseException as exc:  # the backends catch model errors already; this is the last guard
        results = [InferError(f"model '{backend.config.name}' failed: {describe(exc)}", ErrorKind.INTERNAL)
                   ] * len(requests)
    del requests  # drop the input views before the server may replace the segment
    encoded = [_encode(backend.config.name, r) for r in results]
    size = sum(shm.packed_size(e) for e in encoded if isinstance(e, list))
    if size > segments["output"].size:
        send(conn, {"need": size})
        segments.receive({"output": json.loads(conn.recv_bytes())["output"]})
    segment = segments["output"]
    offset, answers = 0, list[dict[str, Any]]()
    for item in encoded:
        if isinstance(item, InferError):
            answers.append({"error": item.message, "kind": item.kind.value})
        else:
            metas, offset = shm.pack(item, segment, offset)
            answers.append({"outputs": metas})
    t = backend.timings
    send(conn, {"results": answers, "timings": [t.input_ns, t.infer_ns, t.output_ns]})


def _encode(model: str, result: dict[str, Any] | InferError) -> list[shm.Encoded] | InferError:
    if isinstance(result, InferError):
        return result
    try:
        return shm.encode(result)
    except (ValueError, TypeError) as exc:
        return InferError(f"model '{model}' produced an output that cannot be sent: {exc}", ErrorKind.INTERNAL)


def _load(init: dict[str, Any]) -> Backend:
    from engines.classic.execution.backends.python import load_python_instance

    config = parse_json(init["config"], "model process init")
    return load_python_instance(config, Path(init["version_dir"]), int(init["index"]),
                                pb_utils.NoBLS(BLS_UNSUPPORTED))


def main(argv: list[str]) -> int:
    conn = Connection(int(argv[1]))
    sock = socket.socket(fileno=os.dup(int(argv[1])))  # the same socket, for the segments' descriptors
    harden_self()  # before any model code runs
    die_with_parent()  # not Linux: the process still exits when the socket closes
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when this process stops
    faulthandler.enable()  # a segfault in model code leaves its traceback in the server's log
    try:
        backend = _load(json.loads(conn.recv_bytes()))
    except BaseException as exc:
        send(conn, {"error": str(exc) if isinstance(exc, Exception) else describe(exc)})
        return 1
    send(conn, {"ok": True})
    segments = _Segments(sock)
    while True:
        try:
            msg = json.loads(conn.recv_bytes())
        except EOFError:
            break
        if msg["op"] == "close":
            break
        _execute(conn, backend, msg, segments)
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
