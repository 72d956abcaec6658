"""The smallest batch from which a model answers each row the same whatever the batch size. Pure: no torch.

Some kernels pick their algorithm by the batch size: libtorch's CPU convolutions give one row
different last bits alone, in a batch of 2-4 and in a batch of 5 or more on an AVX-512 Xeon
(digits_cnn_pt; on AMD EPYC with AVX2 only a batch of one differed). A row's answer must not
depend on whether the dynamic batcher found it company, so a backend pads every batch smaller
than the last regime's first size up to it (zero rows) and keeps the real rows.

`invariant_rows` finds that size at load time, on the machine that serves, from a seeded random
probe (`probe_inputs`): it runs the probe at `top = min(max_batch_size, PROBE_MAX_ROWS)` rows,
then at the powers of two below it, down to the first size whose rows differ from the same rows
at `top`, and bisects between that size and the next power up. Regimes are taken to be ranges
of sizes (a library switches kernels at thresholds), so the sizes between probes are not run:
at most 2·log2(top) + 1 runs, one per probed size, and from 2·top rows (a low threshold) to about
top·log2(top) (one just below top); digits_cnn_pt, top 64, threshold 5: 7 runs, 135 rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from engines.classic.dtypes import wire_to_numpy
from engines.classic.proto import ModelConfig
from engines.classic.repository.config import tensor_wire_type

# The largest probe: batches above it are taken to be in its regime, so that a model with a large
# max_batch_size is not run at hundreds of rows at load time.
PROBE_MAX_ROWS = 64
_SEED = 0


def invariant_rows(run: Callable[[int], Sequence[np.ndarray]], max_rows: int) -> int:
    """The smallest batch size from which every row of `run(n)` equals, bit for bit, the same row
    of `run(top)` (1: the model is batch-invariant, no padding needed).

    `run(n)` returns the model's outputs for the first `n` rows of one fixed probe. Raises what
    `run` raises."""
    top = min(max_rows, PROBE_MAX_ROWS)
    if top <= 1:
        return 1
    reference = [np.asarray(o) for o in run(top)]

    def agrees(n: int) -> bool:
        return all(np.asarray(o).tobytes() == r[:n].tobytes() for o, r in zip(run(n), reference, strict=True))

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
