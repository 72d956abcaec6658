"""TorchScript backend: `torch.jit.load` per instance; inputs are passed positionally in config order.

Like Triton's libtorch backend, outputs map to the config's outputs in order
(a single tensor, or a tuple/list of tensors).

A batch smaller than `pad_rows` runs padded with zero rows up to it, and only its own rows are
kept: libtorch's CPU kernels choose their algorithm by the batch size, so a row's last bits can
depend on how many rows it ran with (digits_cnn_pt on an AVX-512 Xeon: batches of 1, of 2-4 and
of 5 or more are three regimes, up to 1e-6 apart), and a row's answer must not depend on whether
the dynamic batcher found it company. `pad_rows` is measured when the instance loads, on this
machine, by `batch_invariance.invariant_rows` (one measurement per model file, probe inputs and
max_batch_size, and process); when no size is measured (no probe can be made up, the probe fails,
the model is not deterministic, or the probes run past their time budget) a one-row batch runs as
two, the rule that held on the AMD EPYC machines where only N=1 differed. A model with
max_batch_size 0 or 1 never meets a multi-row batch: it is neither measured nor padded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engines.classic.errors import ConfigError
from engines.classic.execution.backends.base import StackedBackend, model_file
from engines.classic.execution.backends.batch_invariance import (
    BUDGET_S,
    FALLBACK_PAD_ROWS,
    PROBE_MAX_ROWS,
    Calibrations,
    Uncalibrated,
    calibrates,
    invariant_rows,
    probe_inputs,
    probe_key,
)
from engines.classic.proto import ModelConfig

log = logging.getLogger(__name__)
# (model file, its mtime and size, probe_key) -> pad_rows: the instances of one model measure once.
_calibrations = Calibrations()


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
        self.pad_rows = self._pad_rows(path) if calibrates(config.max_batch_size) else 1

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
        """The batch size smaller batches are padded to: measured once per key (see the module docstring)."""
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size, probe_key(self.config))
        return _calibrations.rows(key, self._measure)  # instances load in parallel: the first measures

    def _measure(self) -> int:
        top = min(self.config.max_batch_size, PROBE_MAX_ROWS)
        probe = probe_inputs(self.config, top)
        if probe is None:
            return FALLBACK_PAD_ROWS
        arrays = [np.ascontiguousarray(probe[n]) for n in self._input_names]
        started = time.perf_counter()
        try:
            rows = invariant_rows(lambda n: self._forward([a[:n] for a in arrays]), top, budget_s=BUDGET_S)
        except Uncalibrated as exc:  # keep the rule that held before
            log.warning("model %s: no batch-invariant size measured (%s); padding one-row batches to %d",
                        self.config.name, exc, FALLBACK_PAD_ROWS)
            return FALLBACK_PAD_ROWS
        except Exception as exc:  # a model that refuses random input: keep the rule that held before
            log.warning("model %s: batch-size probe failed (%s); padding one-row batches to %d",
                        self.config.name, exc, FALLBACK_PAD_ROWS)
            return FALLBACK_PAD_ROWS
        log.info("model %s: rows are batch-invariant from %d (probed up to %d rows in %.2f s)",
                 self.config.name, rows, top, time.perf_counter() - started)
        return rows
