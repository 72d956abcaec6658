"""The smallest batch from which a model answers each row the same whatever the batch size. No torch.

Some kernels pick their algorithm by the batch size: libtorch's CPU convolutions give one row
different last bits alone, in a batch of 2-4 and in a batch of 5 or more on an AVX-512 Xeon
(digits_cnn_pt; on AMD EPYC with AVX2 only a batch of one differed). A row's answer must not
depend on whether the dynamic batcher found it company, so a backend pads every batch smaller
than the last regime's first size up to it (zero rows) and keeps the real rows.

Only a model that batches has anything to make invariant: with max_batch_size 0 (no batching) or 1
the batcher never puts two rows in one execution, so such a model is neither calibrated nor padded
(`calibrates`).

`invariant_rows` finds that size at load time, on the machine that serves, from a seeded random
probe (`probe_inputs`): it runs the probe at `top = min(max_batch_size, PROBE_MAX_ROWS)` rows
twice (a model whose two answers differ is not deterministic, and no size makes it invariant),
then at the powers of two below it, down to the first size whose rows differ from the same rows
at `top`, and bisects between that size and the next power up. Regimes are taken to be ranges
of sizes (a library switches kernels at thresholds), so the sizes between probes are not run:
at most 2·log2(top) + 2 runs, and from 3·top rows (a low threshold) to about top·(log2(top) + 1)
(one just below top); digits_cnn_pt, top 64, threshold 5: 8 runs, 199 rows. A run cannot be
interrupted, but no probe starts once the runs have taken `BUDGET_S`.

When no size is found (no probe can be made up, a run fails, the model is not deterministic, the
budget is spent) a backend keeps the rule that held before calibration: a one-row batch runs as
`FALLBACK_PAD_ROWS` rows. `Calibrations` keeps one size per model and process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from engines.classic.dtypes import wire_to_numpy
from engines.classic.proto import ModelConfig
from engines.classic.repository.config import tensor_wire_type

# The largest probe: batches above it are taken to be in its regime, so that a model with a large
# max_batch_size is not run at hundreds of rows at load time.
PROBE_MAX_ROWS = 64
# What all the probe runs of one model may take: a model load must not stall on a slow model.
BUDGET_S = 10.0
# The rule that held before calibration, on the AMD EPYC machines where only a batch of one differed.
FALLBACK_PAD_ROWS = 2
_SEED = 0


class Uncalibrated(Exception):
    """The probe runs settle no size: the model is not deterministic, or they ran past the budget."""


def calibrates(max_batch_size: int) -> bool:
    """Whether a model with this max_batch_size can meet a multi-row batch, so is calibrated and padded."""
    return max_batch_size > 1


def invariant_rows(run: Callable[[int], Sequence[np.ndarray]], max_rows: int, *, budget_s: float = BUDGET_S,
                   clock: Callable[[], float] = time.monotonic) -> int:
    """The smallest batch size from which every row of `run(n)` equals, bit for bit, the same row
    of `run(top)` (1: the model is batch-invariant, no padding needed).

    `run(n)` returns the model's outputs for the first `n` rows of one fixed probe; `clock()` is
    in seconds. Raises `Uncalibrated` when two runs at `top` differ or when a probe would start
    `budget_s` or more after the first; raises what `run` raises."""
    top = min(max_rows, PROBE_MAX_ROWS)
    if top <= 1:
        return 1
    started_s = clock()

    def probe(n: int) -> list[np.ndarray]:
        spent_s = clock() - started_s
        if spent_s >= budget_s:
            raise Uncalibrated(f"the probe runs took {spent_s:.1f} s, the budget is {budget_s:g} s")
        return [np.asarray(o) for o in run(n)]

    reference = probe(top)
    if not _same_rows(probe(top), reference, top):
        raise Uncalibrated(f"two runs of the same {top}-row probe differ: the model is not deterministic")

    def agrees(n: int) -> bool:
        return _same_rows(probe(n), reference, n)

    good = top
    n = 1 << ((top - 1).bit_length() - 1)  # the largest power of two below top
    while n >= 1:
        if not agrees(n):
            break
        good, n = n, n // 2
    else:
        return 1
    bad = n
    while good - bad > 1:
        mid = (bad + good) // 2
        if agrees(mid):
            good = mid
        else:
            bad = mid
    return good


def _same_rows(outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray], n: int) -> bool:
    return all(o.tobytes() == r[:n].tobytes() for o, r in zip(outputs, reference, strict=True))


def probe_key(config: ModelConfig) -> Hashable:
    """What of `config` decides the measured size: the probe's inputs (in order, with their names,
    types, dims and reshapes) and max_batch_size. A backend adds the model file's identity."""
    inputs = tuple((t.name, tensor_wire_type(t), tuple(t.dims),
                    tuple(t.reshape.shape) if t.HasField("reshape") else None) for t in config.input)
    return config.max_batch_size, inputs


def probe_inputs(config: ModelConfig, rows: int) -> dict[str, np.ndarray] | None:
    """A seeded random batch of `rows` rows for every input of `config`, shaped as the backend's
    `run` receives them (after `reshape`); None when an input has a variable non-batch dimension
    or a type a probe cannot make up (strings)."""
    rng = np.random.default_rng(_SEED)
    out: dict[str, np.ndarray] = {}
    for tensor in config.input:
        dims = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
        if any(d < 0 for d in dims):
            return None
        dtype = np.dtype(wire_to_numpy(tensor_wire_type(tensor)))
        shape = (rows, *dims)
        if dtype.kind == "f":
            out[tensor.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":  # small values: an index input stays in range
            out[tensor.name] = rng.integers(0, 2, shape).astype(dtype)
        elif dtype.kind == "b":
            out[tensor.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            return None
    return out


class Calibrations:
    """The measured sizes of one process, one per key. The first caller for a key measures while
    later callers for that key wait for it; callers for other keys do not wait (a lock per key), so
    a slow model's calibration holds up no other model's load. A measurement that raises is not kept."""

    def __init__(self) -> None:
        self._rows: dict[Hashable, int] = {}
        self._locks: dict[Hashable, threading.Lock] = {}
        self._locks_guard = threading.Lock()  # held only to find a key's lock, never while measuring

    def rows(self, key: Hashable, measure: Callable[[], int]) -> int:
        with self._locks_guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._rows:
                self._rows[key] = measure()
            return self._rows[key]
