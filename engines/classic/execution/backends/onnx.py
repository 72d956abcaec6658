"""onnxruntime backend: one CPU InferenceSession per model instance."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from engines.classic.errors import ConfigError
from engines.classic.execution.backends.base import StackedBackend, model_file
from engines.classic.execution.inline import bounded_onnx_graph
from engines.classic.proto import ModelConfig, data_type_name

log = logging.getLogger("sluice.classic")


class OnnxBackend(StackedBackend):
    def __init__(self, config: ModelConfig, version_dir: Path) -> None:
        super().__init__(config)
        try:
            import onnxruntime as ort
        except ImportError:
            raise ConfigError("backend 'onnxruntime' needs the onnxruntime package (pip install onnxruntime)") from None
        path = model_file(config, version_dir, "model.onnx")
        options = ort.SessionOptions()
        # Instances run concurrently; give each a small thread pool instead of all cores.
        options.intra_op_num_threads = _int_param(config, "intra_op_thread_count", 1)
        options.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise ConfigError(f"{path}: onnxruntime cannot load the model: {exc}") from None
        source = version_dir.parent / "config.pbtxt"
        session_inputs = {i.name for i in self._session.get_inputs()}
        session_outputs = {o.name for o in self._session.get_outputs()}
        for tensor in config.input:
            if tensor.name not in session_inputs:
                raise ConfigError(f"{source}: field 'input': '{tensor.name}' is not an input of {path.name} "
                                  f"(model inputs: {sorted(session_inputs)})")
        for output in config.output:
            if output.name not in session_outputs:
                raise ConfigError(f"{source}: field 'output': '{output.name}' is not an output of {path.name} "
                                  f"(model outputs: {sorted(session_outputs)})")
        self._output_names = [t.name for t in config.output]
        # Work fixed by the inputs' shapes, and every input dimension but the batch's fixed: a batch's
        # cost is then bounded by its rows, and it may run on the loop when measured cheap.
        unbounded = bounded_onnx_graph(path)
        if unbounded is None and any(d < 0 for t in config.input for d in t.dims):
            unbounded = "an input has a variable dimension"
        tensors = (*config.input, *config.output)
        if unbounded is None and any(data_type_name(t.data_type) == "TYPE_STRING" for t in tensors):
            unbounded = "a string tensor costs its bytes, not its rows"
        self.inline_ok = unbounded is None
        if unbounded is not None:
            log.debug("model %s: batches stay on the instance's thread: %s", config.name, unbounded)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._session.run(self._output_names, inputs)
        return dict(zip(self._output_names, values, strict=True))

    def close(self) -> None:
        self._session = None


def _int_param(config: ModelConfig, key: str, default: int) -> int:
    if key in config.parameters:
        try:
            return max(0, int(config.parameters[key].string_value))
        except ValueError:
            raise ConfigError(f"config.pbtxt: field 'parameters.{key}': must be an integer") from None
    return default
