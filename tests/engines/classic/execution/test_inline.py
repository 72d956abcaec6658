"""Batches that run on the event loop instead of the instance's thread (engines/classic/execution/inline.py)."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from engines.classic import ModelRepositoryManager
from engines.classic.execution import inline
from engines.classic.execution.backends.onnx import OnnxBackend
from engines.classic.execution.inline import (
    BUDGET_NS,
    COOL_OFF_S,
    TRIP,
    TRIP_COUNT,
    WARMUP,
    InlineGate,
    bounded_onnx_graph,
)
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
    # A flatten takes its shape from the input's shape: it cannot grow anything.
    assert bounded_onnx_graph(_graph(tmp_path, [helper.make_node("Shape", ["x"], ["s"]),
                                                helper.make_node("Reshape", ["x", "s"], ["y"])], [x])) is None
    # Sizes from shapes may not grow a tensor (Expand to [b, b] would be quadratic in the batch) ...
    why = bounded_onnx_graph(_graph(tmp_path, [helper.make_node("Shape", ["x"], ["s"]),
                                               helper.make_node("Expand", ["x", "s"], ["y"])], [x]))
    assert why is not None and "Expand" in why
    # ... and a reshape whose shape is a request's values is refused, with what it feeds.
    why = bounded_onnx_graph(_graph(tmp_path, [helper.make_node("Reshape", ["x", "n"], ["r"]),
                                               helper.make_node("Shape", ["r"], ["s"]),
                                               helper.make_node("ConstantOfShape", ["s"], ["y"])], [x, n]))
    assert why is not None and "Reshape takes its size from a computed tensor (n)" in why
    window = helper.make_node("HannWindow", ["n"], ["y"])  # not on the allowlist
    assert "HannWindow is not known" in (bounded_onnx_graph(_graph(tmp_path, [window], [x, n])) or "")
    why = bounded_onnx_graph(_graph(tmp_path, [helper.make_node("Tile", ["x", "n"], ["y"])], [x, n]))
    assert why is not None and "Tile takes its size from a computed tensor (n)" in why
    why = bounded_onnx_graph(_graph(tmp_path, [helper.make_node("Cast", ["n"], ["m"], to=TensorProto.INT64),
                                               helper.make_node("ConstantOfShape", ["m"], ["y"])], [x, n]))
    assert why is not None and "ConstantOfShape" in why
    body = helper.make_graph([], "body", [], [])
    loop = helper.make_node("Loop", ["n", ""], ["y"], body=body)
    assert "op Loop is not known" in (bounded_onnx_graph(_graph(tmp_path, [loop], [x, n])) or "")
    custom = helper.make_node("Fancy", ["x"], ["y"], domain="com.example")
    assert bounded_onnx_graph(_graph(tmp_path, [custom], [x])) == "op com.example.Fancy"
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    assert "cannot read" in (bounded_onnx_graph(tmp_path / "junk.onnx") or "")


def test_the_gate_warms_up_predicts_and_cools_off(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = InlineGate(True, "m")
    gate.observe(5_000_000, 1, inline=False)  # a cold first run does not count (the warm-up's median)
    for _ in range(WARMUP - 2):
        gate.observe(10_000, 1, inline=False)
    assert not gate.wants(1)  # still measuring on the thread
    gate.observe(0, 1, inline=False)  # a failed execution reports no time and is not counted
    assert not gate.wants(1)
    gate.observe(10_000, 1, inline=False)
    budget_rows = BUDGET_NS // 10_000
    assert gate.wants(1) and gate.wants(budget_rows) and not gate.wants(budget_rows + 1)
    for _ in range(TRIP_COUNT - 1):  # a slow run on the loop raises the estimate for a few batches
        gate.observe(TRIP * BUDGET_NS + 1, 1, inline=True)
        assert not gate.wants(1)
        for _ in range(30):
            gate.observe(10_000, 1, inline=False)
        assert gate.wants(1)
    gate.observe(TRIP * BUDGET_NS + 1, 1, inline=True)  # one more: back to the thread for a while
    assert not gate.wants(1)
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + COOL_OFF_S + 1)
    assert not gate.wants(1)  # measured again first
    for _ in range(WARMUP):
        gate.observe(10_000, 1, inline=False)
    assert gate.wants(1)
    never = InlineGate(False, "python model")
    for _ in range(100):
        never.observe(1_000, 1, inline=False)
    assert not never.wants(1)


def test_a_graph_input_that_is_also_an_initializer_is_not_a_constant(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    reps = helper.make_tensor_value_info("reps", TensorProto.INT64, [2])
    init = helper.make_tensor("reps", TensorProto.INT64, [2], [1, 3])
    why = bounded_onnx_graph(_graph(tmp_path, [helper.make_node("Tile", ["x", "reps"], ["y"])], [x, reps], [init]))
    assert why is not None and "Tile" in why


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
    # The path, not this machine's speed, is under test: any measured time is under budget.
    monkeypatch.setattr(inline, "BUDGET_NS", 10**12)

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
