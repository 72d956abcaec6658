"""ModelRepositoryManager end to end in-process: loading, failures, control modes, batching, BLS, ensembles."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from engines.classic import InferError, ModelRepositoryManager
from engines.errors import ErrorKind

DOUBLE_PY = '''
import threading
class SluiceModel:
    calls = []
    def execute_batch(self, inputs):
        SluiceModel.calls.append(inputs["X"].shape[0])
        return {"Y": inputs["X"] * 2}
'''
BLOCKING_PY = '''
import threading
import triton_python_backend_utils as pb_utils
GATE = threading.Event()
STARTED = threading.Semaphore(0)
class TritonPythonModel:
    def execute(self, requests):
        STARTED.release()
        GATE.wait(30)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                .as_numpy())]) for r in requests]
'''
PLUS_ONE_BLS_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            res = pb_utils.InferenceRequest(model_name="double", requested_output_names=["Y"],
                                            inputs=[pb_utils.Tensor("X", x)]).exec()
            y = pb_utils.get_output_tensor_by_name(res, "Y").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y + 1)]))
        return out
'''
CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 2 ] }} ]
{extra}
'''
ENSEMBLE = '''
name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "double" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" } },
  { model_name: "bls_plus_one" model_version: -1 input_map { key: "X" value: "mid" }
    output_map { key: "Y" value: "OUT" } }
] }
'''


def _model(repo: Path, name: str, py: str, extra: str = "", versions=(1,)) -> None:
    (repo / name).mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))
    for v in versions:
        (repo / name / str(v)).mkdir()
        (repo / name / str(v) / "model.py").write_text(py)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    _model(tmp_path, "double", DOUBLE_PY, "dynamic_batching { max_queue_delay_microseconds: 100000 }")
    _model(tmp_path, "blocking", BLOCKING_PY, "dynamic_batching { default_queue_policy { max_queue_size: 1 } }")
    _model(tmp_path, "bls_plus_one", PLUS_ONE_BLS_PY)
    (tmp_path / "ens").mkdir()
    (tmp_path / "ens" / "config.pbtxt").write_text(ENSEMBLE)
    (tmp_path / "ens" / "1").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text("backend: ")
    (tmp_path / "llm").mkdir()
    (tmp_path / "llm" / "config.pbtxt").write_text('backend: "llm"\nmax_batch_size: 0\n')
    return tmp_path


async def _until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll the manager's state, which announces no event, until `condition` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def _x(*rows) -> np.ndarray:
    return np.array(rows, dtype=np.int32)


async def test_loads_repository_and_reports_bad_model(repo):
    m = ModelRepositoryManager(repo)
    await m.start()
    try:
        assert m.ready()
        index = {r["name"]: r for r in m.repository_index()}
        assert index["broken"]["state"] == "UNAVAILABLE" and "broken/config.pbtxt" in index["broken"]["reason"]
        assert "llm" not in index and list(m.llm_model_configs()) == ["llm"]
        out = await m.infer("double", "", {"X": _x([1, 2])})
        assert out["Y"].tolist() == [[2, 4]]
        with pytest.raises(InferError) as err:
            await m.infer("broken", "", {"X": _x([1, 2])})
        assert err.value.kind == ErrorKind.UNAVAILABLE
        with pytest.raises(InferError) as err:
            await m.infer("nope", "", {})
        assert err.value.kind == ErrorKind.NOT_FOUND
        with pytest.raises(InferError) as err:
            await m.infer("llm", "", {})
        assert "generate" in err.value.message
        with pytest.raises(InferError, match="not allowed"):
            await m.load("double")
    finally:
        await m.stop()


async def test_concurrent_requests_batch_and_match_unbatched(repo):
    m = ModelRepositoryManager(repo)
    await m.start()
    try:
        xs = [_x([i, i + 1]) for i in range(6)]
        batched = await asyncio.gather(*(m.infer("double", "", {"X": x}) for x in xs))
        single = [await m.infer("double", "", {"X": x}) for x in xs]
        assert [b["Y"].tolist() for b in batched] == [s["Y"].tolist() for s in single]
        stats = m.statistics("double")[0]
        assert stats.inference_count == 12 and stats.execution_count < 12
        assert max(stats.batch_stats) > 1
    finally:
        await m.stop()


async def test_queue_full_and_cancellation_while_busy(repo):
    m = ModelRepositoryManager(repo)
    await m.start()
    module = None
    try:
        first = asyncio.create_task(m.infer("blocking", "", {"X": _x([1, 1])}))
        await asyncio.sleep(0)
        import sys
        module = [mod for name, mod in sys.modules.items()
                  if name.startswith("sluice_python_model_") and name.endswith("_blocking")][-1]
        await asyncio.to_thread(module.STARTED.acquire, True, 30)
        queued = asyncio.create_task(m.infer("blocking", "", {"X": _x([2, 2])}))
        await _until(lambda: m.statistics("blocking")[0].pending_count == 2)
        with pytest.raises(InferError, match="Exceeds maximum queue size") as err:
            await m.infer("blocking", "", {"X": _x([3, 3])})
        assert err.value.kind == ErrorKind.OVERLOADED
        queued.cancel()  # a cancelled queued request frees its slot
        await _until(lambda: m.statistics("blocking")[0].pending_count == 1)
        replacement = asyncio.create_task(m.infer("blocking", "", {"X": _x([4, 4])}))
        module.GATE.set()
        assert (await first)["Y"].tolist() == [[1, 1]]
        assert (await replacement)["Y"].tolist() == [[4, 4]]
    finally:
        if module is not None:
            module.GATE.set()
        await m.stop()


async def test_bls_and_ensemble(repo):
    m = ModelRepositoryManager(repo)
    await m.start()
    try:
        assert (await m.infer("bls_plus_one", "", {"X": _x([1, 2])}))["Y"].tolist() == [[3, 5]]
        assert (await m.infer("ens", "", {"IN": _x([1, 2], [3, 4])}))["OUT"].tolist() == [[5, 9], [13, 17]]
        assert m.statistics("ens")[0].success.count == 1
    finally:
        await m.stop()


async def test_explicit_mode_load_unload_override(repo):
    m = ModelRepositoryManager(repo, control_mode="explicit", startup_models=["double"])
    await m.start()
    try:
        assert m.model_ready("double") and not m.model_ready("bls_plus_one")
        await m.load("ens")  # loads its composing models too
        assert m.model_ready("ens") and m.model_ready("bls_plus_one")
        await m.load("double", '{"name": "double", "backend": "python", "max_batch_size": 2, '
                               '"input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [2]}], '
                               '"output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [2]}]}')
        assert m.model_config("double").max_batch_size == 2
        with pytest.raises(InferError, match="batch-size must be <= 2"):
            await m.infer("double", "", {"X": _x([1, 1], [1, 1], [1, 1])})
        with pytest.raises(InferError, match="dims"):
            await m.load("double", '{"backend": "python", "input": [{"name": "X", "data_type": "TYPE_INT32", '
                                   '"dims": [0]}], "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [2]}]}')
        await m.unload("double")
        assert not m.model_ready("double")
        assert {r["name"]: r for r in m.repository_index()}["double"]["reason"] == "unloaded"
    finally:
        await m.stop()


async def test_poll_mode_reloads_changed_and_new_models(repo):
    m = ModelRepositoryManager(repo, control_mode="poll", poll_interval_s=3600)
    await m.start()
    try:
        (repo / "double" / "2").mkdir()
        (repo / "double" / "2" / "model.py").write_text(DOUBLE_PY.replace("* 2", "* 3"))
        _model(repo, "fresh", DOUBLE_PY)
        (repo / "broken" / "config.pbtxt").write_text(CONFIG.format(name="broken", extra=""))
        (repo / "broken" / "1" ).mkdir()
        (repo / "broken" / "1" / "model.py").write_text(DOUBLE_PY)
        await m.poll_once()
        assert (await m.infer("double", "", {"X": _x([1, 1])}))["Y"].tolist() == [[3, 3]]
        assert m.model_ready("fresh") and m.model_ready("broken")
        os.rename(repo / "fresh", repo / ".fresh_removed")
        await m.poll_once()
        assert not m.model_ready("fresh")
    finally:
        await m.stop()


def test_manager_config_validation(tmp_path):
    with pytest.raises(ValueError):
        ModelRepositoryManager(tmp_path, control_mode="sometimes")
    with pytest.raises(ValueError):
        ModelRepositoryManager(tmp_path, poll_interval_s=0)
