"""Repository loads that carry files, and model files that must stay inside their model's directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from engines.classic import InferError, ModelRepositoryManager
from engines.classic.repository.uploads import replace_files
from engines.errors import ErrorKind

DOUBLE_PY = "class SluiceModel:\n    def execute_batch(self, inputs):\n        return {'Y': inputs['X'] * 2}\n"
TRIPLE_PY = DOUBLE_PY.replace("* 2", "* 3")
BROKEN_PY = "raise ImportError('this model does not load')\n"
CONFIG = {"name": "m", "backend": "python", "max_batch_size": 4,
          "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
          "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}]}
PBTXT = '''name: "m" backend: "python" max_batch_size: 4
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ] output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text(PBTXT)
    (tmp_path / "m" / "1" / "model.py").write_text(DOUBLE_PY)
    return tmp_path


async def _manager(repo: Path, allow_uploads: bool) -> ModelRepositoryManager:
    m = ModelRepositoryManager(repo, control_mode="explicit", startup_models=["m"], allow_uploads=allow_uploads)
    await m.start()
    return m


async def _y(m: ModelRepositoryManager) -> int:
    return int((await m.infer("m", "", {"X": np.array([[5]], dtype=np.int32)}))["Y"][0, 0])


async def test_uploads_refused_unless_the_server_opts_in(repo):
    m = await _manager(repo, allow_uploads=False)
    before = _tree(repo)
    try:
        with pytest.raises(InferError) as err:
            await m.load("m", json.dumps(CONFIG), {"2/model.py": TRIPLE_PY.encode()})
        assert err.value.kind == ErrorKind.PERMISSION_DENIED and "--allow-model-uploads" in err.value.message
        assert _tree(repo) == before and await _y(m) == 10
    finally:
        await m.stop()


async def test_upload_written_and_served(repo):
    m = await _manager(repo, allow_uploads=True)
    try:
        await m.load("m", json.dumps(CONFIG), {"2/model.py": TRIPLE_PY.encode()})
        assert (repo / "m" / "2" / "model.py").read_text() == TRIPLE_PY and await _y(m) == 15
        assert sorted(p.name for p in repo.iterdir()) == ["m"]  # no staging left behind
    finally:
        await m.stop()


async def test_invalid_override_config_writes_nothing(repo):
    m = await _manager(repo, allow_uploads=True)
    before = _tree(repo)
    try:
        bad = dict(CONFIG, input=[{"name": "X", "data_type": "TYPE_INT32", "dims": [0]}])
        for config in (json.dumps(bad), "{not json", json.dumps(dict(CONFIG, name="other"))):
            with pytest.raises(InferError) as err:
                await m.load("m", config, {"2/model.py": TRIPLE_PY.encode()})
            assert err.value.kind == ErrorKind.INVALID_ARG
        assert _tree(repo) == before and sorted(p.name for p in repo.iterdir()) == ["m"]
        assert await _y(m) == 10
    finally:
        await m.stop()


async def test_failed_load_rolls_the_files_back_and_keeps_serving(repo):
    m = await _manager(repo, allow_uploads=True)
    before = _tree(repo)
    try:
        with pytest.raises(InferError, match="this model does not load"):
            await m.load("m", json.dumps(CONFIG), {"1/model.py": BROKEN_PY.encode(), "1/helper.py": b"x = 1\n"})
        assert _tree(repo) == before and sorted(p.name for p in repo.iterdir()) == ["m"]
        assert m.model_ready("m") and await _y(m) == 10  # the loaded version still serves
    finally:
        await m.stop()


async def test_new_model_upload_that_fails_leaves_no_directory(repo):
    m = await _manager(repo, allow_uploads=True)
    try:
        config = dict(CONFIG, name="fresh")
        with pytest.raises(InferError):
            await m.load("fresh", json.dumps(config), {"1/model.py": BROKEN_PY.encode()})
        assert sorted(p.name for p in repo.iterdir()) == ["m"]
        await m.load("fresh", json.dumps(config), {"1/model.py": DOUBLE_PY.encode()})
        assert m.model_ready("fresh")
    finally:
        await m.stop()


def test_a_symlink_inside_the_model_cannot_carry_a_write_outside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    model = tmp_path / "repo" / "m"
    (model / "1").mkdir(parents=True)
    os.symlink(outside, model / "1" / "data")
    with pytest.raises(InferError, match="inside the model directory"):
        replace_files(model, {"1/data/evil.py": b"x"})
    assert list(outside.iterdir()) == [] and sorted(p.name for p in model.parent.iterdir()) == ["m"]


@pytest.mark.parametrize("filename", ["../../elsewhere.py", "ABSOLUTE", "../1/model.py", "x\0y", "link.py"])
async def test_default_model_filename_must_stay_inside_the_model(repo, tmp_path, filename):
    outside = tmp_path / "elsewhere.py"  # beside the model directory: every filename here names a real file
    outside.write_text(DOUBLE_PY)
    if filename == "ABSOLUTE":
        filename = str(outside)
    os.symlink(outside, repo / "m" / "1" / "link.py")
    m = await _manager(repo, allow_uploads=False)
    try:
        with pytest.raises(InferError) as err:
            await m.load("m", json.dumps(dict(CONFIG, default_model_filename=filename)))
        assert err.value.kind == ErrorKind.INVALID_ARG and "default_model_filename" in err.value.message
        assert await _y(m) == 10
    finally:
        await m.stop()
    text = PBTXT + f'default_model_filename: "{filename.replace(chr(0), "")}"\n'
    if filename == "x\0y":
        text = PBTXT + 'default_model_filename: "x\\000y"\n'
    (repo / "m" / "config.pbtxt").write_text(text)
    m = await _manager(repo, allow_uploads=False)
    try:
        row = {r["name"]: r for r in m.repository_index()}["m"]
        assert row["state"] == "UNAVAILABLE" and "default_model_filename" in row["reason"]
    finally:
        await m.stop()


async def test_an_ensemble_step_cannot_load_a_model_from_outside_the_repository(repo, tmp_path):
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    (outside / "1").mkdir(parents=True)
    (outside / "config.pbtxt").write_text(PBTXT.replace('name: "m" ', ""))
    (outside / "1" / "model.py").write_text("raise SystemExit('outside code ran')\n")
    ensemble = {"name": "ens", "platform": "ensemble", "max_batch_size": 4,
                "input": CONFIG["input"], "output": CONFIG["output"],
                "ensemble_scheduling": {"step": [{"model_name": f"../{outside.name}", "model_version": -1,
                                                  "input_map": {"X": "X"}, "output_map": {"Y": "Y"}}]}}
    (repo / "ens" / "1").mkdir(parents=True)
    m = await _manager(repo, allow_uploads=False)
    try:
        with pytest.raises(InferError) as err:
            await m.load("ens", json.dumps(ensemble))
        assert err.value.kind == ErrorKind.INVALID_ARG and "step[0].model_name" in err.value.message
        assert "invalid model name" in err.value.message
        assert f"../{outside.name}" not in {r["name"] for r in m.repository_index()}
    finally:
        await m.stop()
