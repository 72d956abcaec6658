"""TorchScript backend: `torch.jit.load` per instance; inputs are passed positionally in config order.

Like Triton's libtorch backend, outputs map to the config's outputs in order
(a single tensor, or a tuple/list of tensors).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engines.classic.backends.base import StackedBackend, model_file
from engines.classic.errors import ConfigError
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
        args = [torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in self._input_names]
        with torch.inference_mode():
            result = self._module(*args)
        if isinstance(result, torch.Tensor):
            result = (result,)
        if len(result) != len(self._output_names):
            raise ValueError(f"TorchScript returned {len(result)} outputs, config declares {len(self._output_names)}")
        return {n: t.detach().cpu().numpy() for n, t in zip(self._output_names, result, strict=True)}
