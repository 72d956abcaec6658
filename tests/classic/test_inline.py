"""Batches that run on the event loop instead of the instance's thread (engines/classic/inline.py)."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from engines.classic import ModelRepositoryManager
from engines.classic.backends.onnx import OnnxBackend
from engines.classic.inline import BUDGET_NS, TRIP, WARMUP, InlineGate, bounded_onnx_graph
from tests.integration.kserve_support import REPO_SRC


def _graph(tmp: Path, nodes: list, inputs: list, initializers: list | None = None) -> Path:
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, [out], initializer=initializers or []))
    path = tmp / f"m{len(list(tmp.iterdir()))}.onnx"
    onnx.save(model, str(path))
    return path


def test_only_graphs_whose_work_the_shapes_fix_qualify(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    n = helper.make_tensor_value_info("n", TensorProto.INT64, [2])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [0.5] * 16)
    reps = helper.make_tensor("reps", TensorProto.INT64, [2], [1, 3])
    assert bounded_onnx_graph(_graph(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["h"]),
                                                helper.make_node("Relu", ["h"], ["y"])], [x], [w])) is None
    assert bounded_onnx_graph(_graph(tmp_path, [helper.make_node("Tile", ["x", "reps"], ["y"])], [x], [reps])) is None
    # Shapes alone, however computed, fix a size; a tensor's values do not.
    assert bounded_onnx_graph(_graph(tmp_path, [helper.make_node("Shape", ["x"], ["s"]),
                                                helper.make_node("Expand", ["x", "s"], ["y"])], [x])) is None
    why = bounded_onnx_graph(_graph(tmp_path, [helper.make_node("Tile", ["x", "n"], ["y"])], [x, n]))
    assert why is not None and "Tile takes its size from a computed tensor (n)" in why
    why = bounded_onnx_graph(_graph(tmp_path, [helper.make_node("Cast", ["n"], ["m"], to=TensorProto.INT64),
                                               helper.make_node("ConstantOfShape", ["m"], ["y"])], [x, n]))
    assert why is not None and "ConstantOfShape" in why
    body = helper.make_graph([], "body", [], [])
    assert bounded_onnx_graph(_graph(tmp_path, [helper.make_node("Loop", ["n", ""], ["y"], body=body)],
                                     [x, n])) == "op Loop"
    custom = helper.make_node("Fancy", ["x"], ["y"], domain="com.example")
    assert bounded_onnx_graph(_graph(tmp_path, [custom], [x])) == "op com.example.Fancy"
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    assert "cannot read" in (bounded_onnx_graph(tmp_path / "junk.onnx") or "")


def test_the_gate_warms_up_predicts_and_trips() -> None:
    gate = InlineGate(True, "m")
    for _ in range(WARMUP - 1):
        gate.observe(10_000, 1, inline=False)
    assert not gate.wants(1)  # still measuring on the thread
    gate.observe(10_000, 1, inline=False)
    assert gate.wants(1) and gate.wants(BUDGET_NS // 10_000) and not gate.wants(BUDGET_NS // 10_000 + 1)
    gate.observe(TRIP * BUDGET_NS + 1, 1, inline=True)  # one slow run on the loop: off for good
    for _ in range(100):
        gate.observe(1_000, 1, inline=False)
    assert not gate.wants(1)
    never = InlineGate(False, "python model")
    for _ in range(100):
        never.observe(1_000, 1, inline=False)
    assert not never.wants(1)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(REPO_SRC / "digits_onnx", root / "digits_onnx")
    variable = root / "digits_variable"
    shutil.copytree(REPO_SRC / "digits_onnx", variable)
    text = (variable / "config.pbtxt").read_text().replace('name: "digits_onnx"', 'name: "digits_variable"')
    (variable / "config.pbtxt").write_text(text.replace("dims: [ 64 ]", "dims: [ -1 ]"))
    return root


def test_cheap_batches_run_on_the_loop_and_answer_the_same(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: dict[str, list[int]] = {"digits_onnx": [], "digits_variable": []}
    real_run = OnnxBackend.run

    def run(self: OnnxBackend, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        threads[self.config.name].append(threading.get_ident())
        return real_run(self, inputs)
    monkeypatch.setattr(OnnxBackend, "run", run)

    async def scenario() -> dict[str, list[np.ndarray]]:
        m = ModelRepositoryManager(repo, "none", (), 15.0)
        await m.start()
        x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
        out: dict[str, list[np.ndarray]] = {"digits_onnx": [], "digits_variable": []}
        try:
            for _ in range(WARMUP + 8):
                for name in out:
                    r = await m.infer(name, "", {"input": x}, ["probabilities"], priority=0, timeout_us=0)
                    out[name].append(r["probabilities"])
        finally:
            await m.stop()
        return out

    loop_thread = threading.get_ident()  # asyncio.run runs the loop on this thread
    out = asyncio.run(scenario())
    fixed = threads["digits_onnx"]
    assert all(t != loop_thread for t in fixed[:WARMUP]) and all(t == loop_thread for t in fixed[WARMUP:])
    assert all(t != loop_thread for t in threads["digits_variable"])  # a variable dimension: never on the loop
    first = out["digits_onnx"][0]
    assert all(np.array_equal(first, later) for later in out["digits_onnx"])  # the same bits on either path
