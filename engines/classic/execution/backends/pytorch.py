"""TorchScript backend: `torch.jit.load` per instance; inputs are passed positionally in config order.

Like Triton's libtorch backend, outputs map to the config's outputs in order
(a single tensor, or a tuple/list of tensors).

A batch smaller than `pad_rows` runs padded with zero rows up to it, and only its own rows are
kept: libtorch's CPU kernels choose their algorithm by the batch size, so a row's last bits can
depend on how many rows it ran with (digits_cnn_pt on an AVX-512 Xeon: batches of 1, of 2-4 and
of 5 or more are three regimes, up to 1e-6 apart), and a row's answer must not depend on whether
the dynamic batcher found it company. `pad_rows` is measured when the instance loads, on this
machine, by `batch_invariance.invariant_rows` (one measurement per model file and process); when
no probe can be made up (a variable non-batch dimension, a string input) or the probe fails, a
one-row batch runs as two, the rule that held on the AMD EPYC machines where only N=1 differed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engines.classic.errors import ConfigError
from engines.classic.execution.backends.base import StackedBackend, model_file
from engines.classic.execution.backends.batch_invariance import PROBE_MAX_ROWS, invariant_rows, probe_inputs
from engines.classic.proto import ModelConfig

log = logging.getLogger(__name__)
_FALLBACK_PAD_ROWS = 2  # see the module docstring
# (model file, its mtime and size, max_batch_size) -> pad_rows: the instances of one model measure once.
_measured: dict[tuple[str, int, int, int], int] = {}
_measured_lock = threading.Lock()


class TorchScriptBackend(StackedBackend):
    def __init__(self, config: ModelConfig, version_dir: Path) -> None:
        super().__init__(config)
        try:
            import torch
        except ImportError:
            raise ConfigError("backend 'pytorch' needs torch installed") from None
        path = model_file(config, version_dir, "model.pt")
        try:
            # torch.jit.load has no annotations; it returns a ScriptModule.
            self._module = torch.jit.load(str(path), map_location="cpu").eval()  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise ConfigError(f"{path}: torch.jit.load failed: {exc}") from None
        self._torch = torch
        self._input_names = [t.name for t in config.input]
        self._output_names = [t.name for t in config.output]
        self.pad_rows = self._pad_rows(path) if config.max_batch_size > 0 else 1

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = [np.ascontiguousarray(inputs[n]) for n in self._input_names]
        rows = arrays[0].shape[0] if self.config.max_batch_size > 0 and arrays and arrays[0].ndim else 0
        padded = 0 < rows < self.pad_rows and all(a.ndim and a.shape[0] == rows for a in arrays)
        if padded:  # see the module's docstring
            arrays = [np.concatenate([a, np.zeros((self.pad_rows - rows, *a.shape[1:]), a.dtype)]) for a in arrays]
        result = self._forward(arrays)
        if len(result) != len(self._output_names):
            raise ValueError(f"TorchScript returned {len(result)} outputs, config declares {len(self._output_names)}")
        return {n: a[:rows] if padded else a for n, a in zip(self._output_names, result, strict=True)}

    def _forward(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        torch = self._torch
        with torch.inference_mode():
            result: Any = self._module(*[torch.from_numpy(a) for a in arrays])
        if isinstance(result, torch.Tensor):
            result = (result,)
        return [t.detach().cpu().numpy() for t in result]

    def _pad_rows(self, path: Path) -> int:
        """The batch size smaller batches are padded to: measured once per model file (see the module docstring)."""
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size, self.config.max_batch_size)
        with _measured_lock:  # instances load in parallel: the first measures, the others wait for it
            if key not in _measured:
                _measured[key] = self._measure()
            return _measured[key]

    def _measure(self) -> int:
        top = min(self.config.max_batch_size, PROBE_MAX_ROWS)
        probe = probe_inputs(self.config, top)
        if probe is None:
            return _FALLBACK_PAD_ROWS
        arrays = [np.ascontiguousarray(probe[n]) for n in self._input_names]
        started = time.perf_counter()
        try:
            rows = invariant_rows(lambda n: self._forward([a[:n] for a in arrays]), top)
        except Exception as exc:  # a model that refuses random input: keep the rule that held before
            log.warning("model %s: batch-size probe failed (%s); padding one-row batches to %d",
                        self.config.name, exc, _FALLBACK_PAD_ROWS)
            return _FALLBACK_PAD_ROWS
        log.info("model %s: rows are batch-invariant from %d (probed up to %d rows in %.2f s)",
                 self.config.name, rows, top, time.perf_counter() - started)
        return rows
