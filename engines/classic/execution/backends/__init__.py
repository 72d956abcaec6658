"""Classic backends. `create_instance` builds one model instance for a backend name.

Heavy imports (onnxruntime, torch) happen only inside the backend that needs them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines.classic.errors import ConfigError
from engines.classic.execution.backends.base import Backend, ComputeTimes, StackedBackend
from engines.classic.proto import ModelConfig

__all__ = ["Backend", "ComputeTimes", "StackedBackend", "create_instance"]


def create_instance(config: ModelConfig, version_dir: Path, instance_index: int, host: Any,
                    isolated_limit_s: float | None = None, model_user: str | None = None) -> Backend:
    """Build instance number `instance_index` of a model version (blocking: loads the model).

    `host` is the manager (for BLS calls from python models). With `isolated_limit_s`
    (a python model with `isolation: process`), the instance runs in its own process
    and that is its execute time limit (0: none); `model_user` is the user that process
    runs as (None: the server's). Raises ConfigError for a missing
    model file or a model that does not match its config.
    """
    backend = config.backend
    if backend == "onnxruntime":
        from engines.classic.execution.backends.onnx import OnnxBackend

        return OnnxBackend(config, version_dir)
    if backend == "pytorch":
        from engines.classic.execution.backends.pytorch import TorchScriptBackend

        return TorchScriptBackend(config, version_dir)
    if backend == "python" and isolated_limit_s is not None:
        from engines.classic.execution.backends.isolated import IsolatedPythonBackend

        return IsolatedPythonBackend(config, version_dir, instance_index, isolated_limit_s, model_user)
    if backend == "python":
        from engines.classic.execution.backends.python import load_python_instance

        return load_python_instance(config, version_dir, instance_index, host)
    raise ConfigError(f"{version_dir.parent / 'config.pbtxt'}: field 'backend': no instance backend '{backend}'")

