"""The classic scheduler under faults, in-process: dying loops, misbehaving model code, hung executes, floods.

Every wait is bounded (`asyncio.wait_for`) so that a regression fails instead of hanging;
no assertion is on a duration.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from engines.classic import InferError, ModelRepositoryManager
from engines.classic.limits import ClassicLimits
from engines.errors import ErrorKind

BOUND_S = 30.0  # how long any single step may take before the test calls it a hang

GATED_PY = '''
import threading
import triton_python_backend_utils as pb_utils
GATE = threading.Event()
STARTED = threading.Semaphore(0)
class TritonPythonModel:
    def execute(self, requests):
        STARTED.release()
        GATE.wait(60)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                .as_numpy())]) for r in requests]
'''
# The model's first call blocks until released; every later call (a replacement instance) answers at once.
HANGS_ONCE_PY = '''
import os, threading
import triton_python_backend_utils as pb_utils
RELEASE = threading.Event()
CALLS = []
class TritonPythonModel:
    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], args["model_version"], "hung")
    def execute(self, requests):
        CALLS.append(threading.get_ident())
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            RELEASE.wait(60)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                .as_numpy() + 1)]) for r in requests]
'''
RAISES_PY = '''
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        if x[0, 0] == 1:
            raise SystemExit(3)
        if x[0, 0] == 2:
            raise KeyboardInterrupt
        if x[0, 0] == 3:
            raise GeneratorExit("odd")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)])]
'''
EXIT_AT_LOAD_PY = '''
import sys
class SluiceModel:
    def initialize(self, args):
        sys.exit("no thanks")
    def execute_batch(self, inputs):
        return {"Y": inputs["X"]}
'''
CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 2 ] }} ]
{extra}
'''


def _model(repo: Path, name: str, py: str, extra: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))
    (repo / name / "1" / "model.py").write_text(py)


def _module(name: str):
    return [m for n, m in sys.modules.items() if n.startswith("sluice_python_model_") and n.endswith(f"_{name}")][-1]


def _x(*rows) -> np.ndarray:
    return np.array(rows, dtype=np.int32)


async def _bounded(awaitable):
    return await asyncio.wait_for(awaitable, BOUND_S)


@pytest.fixture()
async def manager(tmp_path: Path):
    _model(tmp_path, "gated", GATED_PY)
    _model(tmp_path, "hangs_once", HANGS_ONCE_PY,
           'parameters { key: "execute_timeout_s" value { string_value: "0.2" } }')
    _model(tmp_path, "raises", RAISES_PY)
    _model(tmp_path, "exit_at_load", EXIT_AT_LOAD_PY)
    m = ModelRepositoryManager(tmp_path, limits=ClassicLimits(max_queue_size=4))
    await m.start()
    yield m
    for name in ("gated", "hangs_once"):
        for attr in ("GATE", "RELEASE"):
            event = getattr(_module(name), attr, None)
            if event is not None:
                event.set()
    await m.stop()


async def test_injected_scheduler_failure_fails_its_requests_and_restarts(manager, caplog):
    scheduler = manager.get_version("gated").scheduler
    real = scheduler._queue.form_batch
    calls = []

    def broken(now_ns):
        calls.append(now_ns)
        if len(calls) == 1:
            raise RuntimeError("injected fault")
        return real(now_ns)

    scheduler._queue.form_batch = broken
    _module("gated").GATE.set()
    with caplog.at_level(logging.ERROR, logger="sluice.classic"), pytest.raises(InferError) as err:
        await _bounded(manager.infer("gated", "", {"X": _x([1, 1])}))
    assert err.value.kind == ErrorKind.INTERNAL
    assert "scheduler failed (RuntimeError: injected fault)" in err.value.message
    assert any("scheduler of model 'gated' failed" in r.message and r.exc_info for r in caplog.records)
    assert (await _bounded(manager.infer("gated", "", {"X": _x([2, 2])})))["Y"].tolist() == [[2, 2]]
    assert scheduler.restarts == 1  # counted, as every background task's restarts are


async def test_repository_poller_is_restarted_after_a_failure(tmp_path: Path, caplog):
    m = ModelRepositoryManager(tmp_path, control_mode="poll", poll_interval_s=0.01)
    polled = asyncio.Event()
    calls = []

    async def poll_once():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("injected: repository unreadable")
        polled.set()

    m.poll_once = poll_once
    with caplog.at_level(logging.ERROR, logger="sluice.classic"):
        await m.start()
        try:
            await _bounded(polled.wait())
        finally:
            await m.stop()
    assert any("background task repository poller failed" in r.message for r in caplog.records)
    assert m._poller.restarts.total == 1  # counted, as every background task's restarts are


async def test_queue_bound_from_the_server_default_under_a_flood(manager):
    scheduler = manager.get_version("gated").scheduler
    gated = _module("gated")
    running = asyncio.create_task(manager.infer("gated", "", {"X": _x([0, 0])}))
    await _bounded(asyncio.to_thread(gated.STARTED.acquire, True, BOUND_S))
    flood = [asyncio.create_task(manager.infer("gated", "", {"X": _x([i, i])})) for i in range(1, 41)]
    await _bounded(_until(lambda: sum(t.done() for t in flood) == 36))  # refused at once, in arrival order
    assert scheduler.queued == 4  # the config sets no max_queue_size: the server's bound holds
    refused = [t for t in flood if t.done()]
    assert all(isinstance(t.exception(), InferError) and t.exception().kind == ErrorKind.OVERLOADED for t in refused)
    gated.GATE.set()
    assert (await _bounded(running))["Y"].tolist() == [[0, 0]]
    accepted = [await _bounded(t) for t in flood if t not in refused]
    assert [a["Y"][0, 0] for a in accepted] == [1, 2, 3, 4]


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("value, raised", [(1, "SystemExit: 3"), (2, "KeyboardInterrupt"),
                                           (3, "GeneratorExit: odd")])
async def test_model_raising_base_exceptions_fails_its_request_only(manager, value, raised):
    with pytest.raises(InferError) as err:
        await _bounded(manager.infer("raises", "", {"X": _x([value, 0])}))
    assert err.value.kind == ErrorKind.INTERNAL and raised in err.value.message
    assert (await _bounded(manager.infer("raises", "", {"X": _x([5, 6])})))["Y"].tolist() == [[5, 6]]


async def test_sys_exit_in_initialize_fails_that_model_only(manager):
    row = {r["name"]: r for r in manager.repository_index()}["exit_at_load"]
    assert row["state"] == "UNAVAILABLE" and "initialize() failed: SystemExit: no thanks" in row["reason"]
    assert manager.model_ready("raises")


async def test_hung_execute_fails_at_the_limit_and_a_replacement_serves(manager):
    module = _module("hangs_once")
    with pytest.raises(InferError) as err:
        await _bounded(manager.infer("hangs_once", "", {"X": _x([1, 1])}))
    assert err.value.kind == ErrorKind.UNAVAILABLE and "exceeded its time limit of 0.2 s" in err.value.message
    # The hung thread is still inside execute(); a replacement instance (a new module, a new thread) serves.
    assert (await _bounded(manager.infer("hangs_once", "", {"X": _x([2, 2])})))["Y"].tolist() == [[3, 3]]
    assert _module("hangs_once") is not module and len(module.CALLS) == 1
    module.RELEASE.set()  # the abandoned instance returns; it is closed, the replacement keeps serving
    assert (await _bounded(manager.infer("hangs_once", "", {"X": _x([4, 4])})))["Y"].tolist() == [[5, 5]]


async def test_a_far_deadline_does_not_break_the_driver(manager):
    # The API refuses timeouts over an hour; the driver must survive one anyway (10**400 µs used to
    # overflow its float conversion and kill it silently while the model was busy).
    from engines.classic.request import InferRequest

    model = manager.get_version("gated")
    gated = _module("gated")
    running = asyncio.create_task(manager.infer("gated", "", {"X": _x([0, 0])}))
    await _bounded(asyncio.to_thread(gated.STARTED.acquire, True, BOUND_S))
    far = InferRequest("gated", "1", {"X": _x([7, 7])}, timeout_us=10**400, batch_size=1)
    queued = asyncio.create_task(model.scheduler.submit(far))
    await _bounded(_until(lambda: model.scheduler.queued == 1))
    gated.GATE.set()
    assert (await _bounded(running))["Y"].tolist() == [[0, 0]]
    assert (await _bounded(queued))["Y"].tolist() == [[7, 7]]
