"""Finding the batch size from which rows come out the same (engines/classic/execution/backends/batch_invariance.py),
on models whose batch-size regimes the test sets, and the TorchScript backend padding smaller batches up to it.
The end-to-end check on the shipped models is tests/engines/classic/scheduling/test_batched_bits.py."""

from __future__ import annotations

import logging
import math
import threading
from pathlib import Path

import numpy as np
import pytest

from engines.classic.execution.backends.batch_invariance import (
    PROBE_MAX_ROWS,
    Calibrations,
    Uncalibrated,
    calibrates,
    invariant_rows,
    probe_inputs,
    probe_key,
)
from engines.classic.repository.config import parse_text

ROWS = np.random.default_rng(3).standard_normal((PROBE_MAX_ROWS, 4)).astype(np.float32)


class Regimes:
    """A model whose sums round differently below each of `starts` (its regimes' first sizes), as a
    kernel chosen by the batch size does; records the batch sizes it ran."""

    def __init__(self, *starts: int) -> None:
        self.starts = starts
        self.sizes: list[int] = []

    def __call__(self, n: int) -> list[np.ndarray]:
        self.sizes.append(n)
        regime = sum(n >= s for s in self.starts)
        x = ROWS[:n].astype(np.float64)
        return [np.round(x * 3, 3 + regime).astype(np.float32), np.full((n, 1), 7, np.int64)]


def test_three_regimes_as_on_an_avx512_xeon_pad_to_the_last_ones_first_size() -> None:
    model = Regimes(2, 5)  # 1 | 2-4 | 5 and more
    assert invariant_rows(model, 64) == 5
    # The reference twice, then one run per probed size: the powers of two down to the first that differs, a bisection.
    assert model.sizes == [64, 64, 32, 16, 8, 4, 6, 5]


@pytest.mark.parametrize("max_rows", [2, 3, 7, 64, 1000])
def test_every_threshold_is_found(max_rows: int) -> None:
    top = min(max_rows, PROBE_MAX_ROWS)
    for start in range(2, top + 1):
        model = Regimes(start)
        assert invariant_rows(model, max_rows) == start, start
        assert model.sizes[:2] == [top, top] and max(model.sizes[1:]) == top
        assert len(model.sizes[1:]) == len(set(model.sizes[1:]))  # no size probed twice after the reference
        assert len(model.sizes) <= 2 * math.log2(top) + 2
        assert sum(model.sizes) <= top * (3 + math.log2(top))


def test_a_batch_invariant_model_needs_no_padding() -> None:
    model = Regimes()
    assert invariant_rows(model, 64) == 1
    assert model.sizes == [64, 64, 32, 16, 8, 4, 2, 1]


@pytest.mark.parametrize("max_batch_size", [0, 1])
def test_without_batching_room_nothing_is_run(max_batch_size: int) -> None:
    model = Regimes(2)
    assert not calibrates(max_batch_size)
    assert invariant_rows(model, max_batch_size) == 1 and model.sizes == []


def test_a_model_that_batches_is_calibrated() -> None:
    assert calibrates(2) and calibrates(1000)


def test_a_model_that_is_not_deterministic_is_not_calibrated() -> None:
    sizes: list[int] = []
    noise = np.random.default_rng(1)

    def noisy(n: int) -> list[np.ndarray]:
        sizes.append(n)
        return [ROWS[:n] + noise.standard_normal((n, 4)).astype(np.float32) * 1e-6]

    with pytest.raises(Uncalibrated, match="not deterministic"):
        invariant_rows(noisy, 16)
    assert sizes == [16, 16]  # nothing is probed after the two reference runs


class Clock:
    """A clock that the model advances by `run_s` per run."""

    def __init__(self, model: Regimes, run_s: float) -> None:
        self.model, self.run_s, self.now_s = model, run_s, 0.0

    def __call__(self) -> float:
        return self.now_s

    def run(self, n: int) -> list[np.ndarray]:
        self.now_s += self.run_s
        return self.model(n)


def test_probing_stops_once_the_budget_is_spent() -> None:
    clock = Clock(Regimes(2, 5), run_s=3.0)
    with pytest.raises(Uncalibrated, match="budget"):
        invariant_rows(clock.run, 64, budget_s=10.0, clock=clock)
    # Runs start at 0, 3, 6 and 9 s; none starts at 12 s.
    assert clock.model.sizes == [64, 64, 32, 16]


def test_within_the_budget_the_answer_is_unchanged() -> None:
    clock = Clock(Regimes(2, 5), run_s=1.0)
    assert invariant_rows(clock.run, 64, budget_s=10.0, clock=clock) == 5
    assert clock.model.sizes == [64, 64, 32, 16, 8, 4, 6, 5]


def test_a_probe_that_fails_raises() -> None:
    def broken(n: int) -> list[np.ndarray]:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        invariant_rows(broken, 8)


def _config(inputs: str, max_batch_size: int = 8) -> str:
    return (f'name: "m" platform: "pytorch_libtorch" max_batch_size: {max_batch_size}\n{inputs}\n'
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]')


@pytest.mark.parametrize("other", [
    _config('input [ { name: "z" data_type: TYPE_FP32 dims: [ 4 ] } ]'),
    _config('input [ { name: "x" data_type: TYPE_FP64 dims: [ 4 ] } ]'),
    _config('input [ { name: "x" data_type: TYPE_FP32 dims: [ 5 ] } ]'),
    _config('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]'),
    _config('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]', max_batch_size=16),
    _config('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "w" data_type: TYPE_FP32 dims: [ 1 ] } ]'),
])
def test_the_key_changes_with_what_changes_the_answer(other: str) -> None:
    one = _config('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]')
    assert probe_key(parse_text(one, "t")) == probe_key(parse_text(one, "t"))
    assert probe_key(parse_text(other, "t")) != probe_key(parse_text(one, "t"))


def test_a_slow_calibration_holds_up_no_other_key() -> None:
    calibrations, order = Calibrations(), []
    slow_started, fast_done = threading.Event(), threading.Event()

    def slow() -> int:
        slow_started.set()
        fast_done.wait(timeout=10)  # with one lock for all keys, `fast` would wait for this timeout
        order.append("slow")
        return 3

    def fast() -> int:
        order.append("fast")
        return 5

    thread = threading.Thread(target=calibrations.rows, args=("a", slow))
    thread.start()
    assert slow_started.wait(timeout=30)
    assert calibrations.rows("b", fast) == 5
    fast_done.set()
    thread.join()
    assert order == ["fast", "slow"]
    assert calibrations.rows("a", fast) == 3 and order == ["fast", "slow"]  # measured once per key


def test_probe_inputs_follow_the_config_and_the_seed() -> None:
    config = parse_text(_config(
        'input [ { name: "a" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } },'
        '        { name: "b" data_type: TYPE_INT64 dims: [ 3 ] },'
        '        { name: "c" data_type: TYPE_BOOL dims: [ 1 ] } ]'), "t")
    probe = probe_inputs(config, 5)
    assert probe is not None
    assert (probe["a"].shape, probe["a"].dtype) == ((5, 2, 2), np.float32)
    assert (probe["b"].shape, probe["b"].dtype) == ((5, 3), np.int64) and set(np.unique(probe["b"])) <= {0, 1}
    assert (probe["c"].shape, probe["c"].dtype) == ((5, 1), np.bool_)
    again = probe_inputs(config, 5)
    assert again is not None and all(again[n].tobytes() == probe[n].tobytes() for n in probe)


@pytest.mark.parametrize("inputs", ['input [ { name: "a" data_type: TYPE_FP32 dims: [ -1 ] } ]',
                                    'input [ { name: "s" data_type: TYPE_STRING dims: [ 1 ] } ]'])
def test_no_probe_for_variable_shapes_or_strings(inputs: str) -> None:
    assert probe_inputs(parse_text(_config(inputs), "t"), 4) is None


def _torchscript(tmp: Path, threshold: int) -> Path:
    """A TorchScript model that adds 1e-3 to every row of a batch smaller than `threshold`."""
    torch = pytest.importorskip("torch")

    class Model(torch.nn.Module):
        def __init__(self, threshold: int) -> None:
            super().__init__()
            self.threshold = threshold

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.size(0) < self.threshold:
                return x * 2.0 + 1e-3
            return x * 2.0

    (tmp / "1").mkdir(parents=True)
    torch.jit.save(torch.jit.script(Model(threshold)), str(tmp / "1" / "model.pt"))
    return tmp / "1"


@pytest.mark.parametrize("threshold", [1, 2, 6])
def test_the_torchscript_backend_pads_small_batches_to_the_measured_size(tmp_path: Path, threshold: int) -> None:
    from engines.classic.execution.backends.pytorch import TorchScriptBackend

    version_dir = _torchscript(tmp_path, threshold)
    config = parse_text(_config('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]', 16), "t")
    backend = TorchScriptBackend(config, version_dir)
    assert backend.pad_rows == threshold
    together = backend.run({"x": ROWS[:8]})["y"]
    for i in range(8):
        alone = backend.run({"x": ROWS[i:i + 1]})["y"]
        assert alone.shape == (1, 4) and alone.tobytes() == together[i:i + 1].tobytes()
    assert backend.run({"x": ROWS[:3]})["y"].tobytes() == together[:3].tobytes()


def test_the_torchscript_backend_falls_back_to_two_rows_without_a_probe(tmp_path: Path) -> None:
    from engines.classic.execution.backends.pytorch import TorchScriptBackend

    config = parse_text(_config('input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]', 16), "t")
    assert TorchScriptBackend(config, _torchscript(tmp_path, 6)).pad_rows == 2


def _noisy_torchscript(tmp: Path) -> Path:
    """A TorchScript model that adds fresh noise to every answer: two runs of one batch differ."""
    torch = pytest.importorskip("torch")

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2.0 + torch.rand_like(x) * 1e-3

    (tmp / "1").mkdir(parents=True)
    torch.jit.save(torch.jit.script(Model()), str(tmp / "1" / "model.pt"))
    return tmp / "1"


def test_the_torchscript_backend_keeps_two_rows_for_a_model_that_is_not_deterministic(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from engines.classic.execution.backends.pytorch import TorchScriptBackend

    version_dir = _noisy_torchscript(tmp_path)
    config = parse_text(_config('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]', 16), "t")
    with caplog.at_level(logging.WARNING, logger="engines.classic.execution.backends.pytorch"):
        assert [TorchScriptBackend(config, version_dir).pad_rows for _ in range(2)] == [2, 2]
    assert [r.getMessage() for r in caplog.records if "not deterministic" in r.getMessage()] == [
        "model m: no batch-invariant size measured (two runs of the same 16-row probe differ: the model is not "
        "deterministic); padding one-row batches to 2"]  # one instance measured; the other found its size


def test_the_torchscript_backend_keeps_two_rows_past_the_budget(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from engines.classic.execution.backends import pytorch

    monkeypatch.setattr(pytorch, "BUDGET_S", 0.0)
    config = parse_text(_config('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]', 16), "t")
    with caplog.at_level(logging.WARNING, logger="engines.classic.execution.backends.pytorch"):
        assert pytorch.TorchScriptBackend(config, _torchscript(tmp_path, 6)).pad_rows == 2
    assert any("budget" in r.getMessage() for r in caplog.records)


def test_the_torchscript_backend_measures_one_file_again_for_other_inputs(tmp_path: Path) -> None:
    from engines.classic.execution.backends.pytorch import TorchScriptBackend

    version_dir = _torchscript(tmp_path, 6)
    unprobed = parse_text(_config('input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]', 16), "t")
    probed = parse_text(_config('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]', 16), "t")
    assert TorchScriptBackend(unprobed, version_dir).pad_rows == 2
    assert TorchScriptBackend(probed, version_dir).pad_rows == 6


@pytest.mark.parametrize("max_batch_size", [0, 1])
@pytest.mark.parametrize("dims", ["-1", "4"])
def test_the_torchscript_backend_neither_measures_nor_pads_without_batching(
        tmp_path: Path, max_batch_size: int, dims: str) -> None:
    from engines.classic.execution.backends.pytorch import TorchScriptBackend

    inputs = f'input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {dims} ] }} ]'
    config = parse_text(_config(inputs, max_batch_size), "t")
    backend = TorchScriptBackend(config, _torchscript(tmp_path, 6))
    assert backend.pad_rows == 1
    x = ROWS[:1] if max_batch_size else ROWS[0]
    assert backend.run({"x": x})["y"].tobytes() == (x * np.float32(2.0) + np.float32(1e-3)).tobytes()  # ran alone
