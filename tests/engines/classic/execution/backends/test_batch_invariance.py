"""Finding the batch size from which rows come out the same (engines/classic/execution/backends/batch_invariance.py),
on models whose batch-size regimes the test sets, and the TorchScript backend padding smaller batches up to it.
The end-to-end check on the shipped models is tests/engines/classic/scheduling/test_batched_bits.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from engines.classic.execution.backends.batch_invariance import PROBE_MAX_ROWS, invariant_rows, probe_inputs
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
    # One run per probed size: the reference, the powers of two down to the first that differs, a bisection.
    assert model.sizes == [64, 32, 16, 8, 4, 6, 5]


@pytest.mark.parametrize("max_rows", [2, 3, 7, 64, 1000])
def test_every_threshold_is_found(max_rows: int) -> None:
    top = min(max_rows, PROBE_MAX_ROWS)
    for start in range(2, top + 1):
        model = Regimes(start)
        assert invariant_rows(model, max_rows) == start, start
        assert max(model.sizes) == top and len(model.sizes) == len(set(model.sizes))
        assert len(model.sizes) <= 2 * math.log2(top) + 1
        assert sum(model.sizes) <= top * (2 + math.log2(top))


def test_a_batch_invariant_model_needs_no_padding() -> None:
    model = Regimes()
    assert invariant_rows(model, 64) == 1
    assert model.sizes == [64, 32, 16, 8, 4, 2, 1]


def test_without_batching_room_nothing_is_run() -> None:
    model = Regimes(2)
    assert invariant_rows(model, 1) == 1 and model.sizes == []


def test_a_probe_that_fails_raises() -> None:
    def broken(n: int) -> list[np.ndarray]:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        invariant_rows(broken, 8)


def _config(inputs: str, max_batch_size: int = 8) -> str:
    return (f'name: "m" platform: "pytorch_libtorch" max_batch_size: {max_batch_size}\n{inputs}\n'
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]')


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
