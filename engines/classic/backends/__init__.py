"""Classic backends. `create_instance` builds one model instance for a backend name.

Heavy imports (onnxruntime, torch) happen only inside the backend that needs them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines.classic.backends.base import Backend, ComputeTimes, StackedBackend
from engines.classic.errors import ConfigError
from engines.classic.proto import ModelConfig

__all__ = ["Backend", "ComputeTimes", "StackedBackend", "create_instance"]


def create_instance(config: ModelConfig, version_dir: Path, instance_index: int, host: Any) -> Backend:
    """Build instance number `instance_index` of a model version.

    `host` is the manager (for BLS calls from python models). Raises ConfigError
    for a missing model file or a model that does not match its config.
    """
    backend = config.backend
    if backend == "onnxruntime":
        from engines.classic.backends.onnx import OnnxBackend

        return OnnxBackend(config, version_dir)
    if backend == "pytorch":
        from engines.classic.backends.pytorch import TorchScriptBackend

        return TorchScriptBackend(config, version_dir)
    if backend == "python":
        from engines.classic.backends.python import load_python_instance

        return load_python_instance(config, version_dir, instance_index, host)
    raise ConfigError(f"{version_dir.parent / 'config.pbtxt'}: field 'backend': no instance backend '{backend}'")

