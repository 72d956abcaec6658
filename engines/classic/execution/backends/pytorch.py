"""TorchScript backend: `torch.jit.load` per instance; inputs are passed positionally in config order.

Like Triton's libtorch backend, outputs map to the config's outputs in order
(a single tensor, or a tuple/list of tensors).

A batch of one row runs as two (the row and a zero row), its first row kept: libtorch's CPU
convolutions take another path for N=1 whose sums round differently (digits_cnn_pt: up to 1e-6
away from the same row in any larger batch), and a row's answer must not depend on whether the
dynamic batcher found it company. Batches of two rows or more agree bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engines.classic.errors import ConfigError
from engines.classic.execution.backends.base import StackedBackend, model_file
from engines.classic.proto import ModelConfig


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

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        arrays = [np.ascontiguousarray(inputs[n]) for n in self._input_names]
        single = self.config.max_batch_size > 0 and all(a.ndim and a.shape[0] == 1 for a in arrays)
        if single:  # see the module's docstring
            arrays = [np.concatenate([a, np.zeros_like(a)]) for a in arrays]
        with torch.inference_mode():
            result = self._module(*[torch.from_numpy(a) for a in arrays])
        if isinstance(result, torch.Tensor):
            result = (result,)
        if len(result) != len(self._output_names):
            raise ValueError(f"TorchScript returned {len(result)} outputs, config declares {len(self._output_names)}")
        return {n: t.detach().cpu().numpy()[:1] if single else t.detach().cpu().numpy()
                for n, t in zip(self._output_names, result, strict=True)}
