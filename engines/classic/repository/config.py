"""Reading and validating a model's config.pbtxt.

`load_config` parses the text proto into `ModelConfig`, fills the defaults Triton
fills (name, platform -> backend), and validates what Sluice relies on. Every
error is a `ConfigError` whose message names the file and the field.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import json_format, text_format

from engines.classic.dtypes import WIRE_TYPES, config_to_wire
from engines.classic.errors import ConfigError
from engines.classic.limits import check_parameters
from engines.classic.proto import TYPE_INVALID, ModelConfig, ModelTensor, data_type_name, new_model_config

# Triton platform names that select one of our backends.
_PLATFORM_TO_BACKEND = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "ensemble": "ensemble",
}
SUPPORTED_BACKENDS = frozenset({"onnxruntime", "python", "pytorch", "ensemble", "llm"})
# The batcher keeps one queue per level and scans them all for each batch it forms.
MAX_PRIORITY_LEVELS = 1024


def parse_text(text: str, source: str) -> ModelConfig:
    """Parse config.pbtxt text; `source` names the file in error messages."""
    config = new_model_config()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"{source}: malformed config: {exc}") from None
    return config


def parse_json(text: str | bytes, source: str) -> ModelConfig:
    """Parse a JSON ModelConfig (the `config` override of a repository load)."""
    config = new_model_config()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise ConfigError(f"{source}: malformed config JSON: {exc}") from None
    return config


def load_config(model_dir: Path) -> ModelConfig:
    """Read `<model_dir>/config.pbtxt`, normalise and validate it."""
    path = model_dir / "config.pbtxt"
    if not path.is_file():
        raise ConfigError(f"{path}: missing config.pbtxt")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    config = parse_text(text, str(path))
    normalise(config, model_dir.name, str(path))
    validate(config, str(path))
    return config


def normalise(config: ModelConfig, dir_name: str, source: str) -> None:
    """Fill defaults in place: name from the directory, backend from platform."""
    if not config.name:
        config.name = dir_name
    elif config.name != dir_name:
        raise ConfigError(f"{source}: field 'name': '{config.name}' does not match directory '{dir_name}'")
    if not config.backend and config.platform:
        config.backend = _PLATFORM_TO_BACKEND.get(config.platform, "")
        if not config.backend:
            raise ConfigError(f"{source}: field 'platform': unsupported platform '{config.platform}'")
    if not config.backend and config.HasField("ensemble_scheduling"):
        config.backend = "ensemble"
    if config.backend == "ensemble" and not config.platform:
        config.platform = "ensemble"


def validate(config: ModelConfig, source: str) -> None:
    """Raise ConfigError naming `source` and the field for anything Sluice cannot serve."""
    if config.backend not in SUPPORTED_BACKENDS:
        got = config.backend or "(none)"
        raise ConfigError(
            f"{source}: field 'backend': unsupported backend '{got}'; expected one of {sorted(SUPPORTED_BACKENDS)}"
        )
    if config.max_batch_size < 0:
        raise ConfigError(f"{source}: field 'max_batch_size': must be >= 0, got {config.max_batch_size}")
    if config.backend == "llm":
        return  # served by the LLM path; its tensors are not ours to check
    if not config.input:
        raise ConfigError(f"{source}: field 'input': a model needs at least one input")
    if not config.output:
        raise ConfigError(f"{source}: field 'output': a model needs at least one output")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for tensor in tensors:
            _validate_tensor(kind, tensor, source)
            if tensor.name in seen:
                raise ConfigError(f"{source}: field '{kind}': duplicate tensor name '{tensor.name}'")
            seen.add(tensor.name)
    _validate_batcher(config, source)
    check_parameters(config, source)
    for i, group in enumerate(config.instance_group):
        if group.count < 0:
            raise ConfigError(f"{source}: field 'instance_group[{i}].count': must be >= 0, got {group.count}")


def _validate_tensor(kind: str, tensor: ModelTensor, source: str) -> None:
    where = f"{kind} '{tensor.name}': field '"
    if not tensor.name:
        raise ConfigError(f"{source}: field '{kind}.name': every {kind} needs a name")
    if tensor.data_type == TYPE_INVALID:
        raise ConfigError(f"{source}: {where}data_type': missing or TYPE_INVALID")
    try:
        wire = config_to_wire(data_type_name(tensor.data_type))
    except ValueError:  # proto3 enums are open: text format accepts any number
        raise ConfigError(f"{source}: {where}data_type': unknown data type {tensor.data_type}") from None
    if wire not in WIRE_TYPES:
        raise ConfigError(f"{source}: {where}data_type': unsupported data type '{wire}'")
    if not tensor.dims and not tensor.HasField("reshape"):
        raise ConfigError(f"{source}: {where}dims': must not be empty (use [ 1 ] with reshape {{ shape: [ ] }})")
    for i, dim in enumerate(tensor.dims):
        if dim == 0 or dim < -1:
            raise ConfigError(f"{source}: {where}dims[{i}]': must be -1 or positive, got {dim}")


def _validate_batcher(config: ModelConfig, source: str) -> None:
    if not config.HasField("dynamic_batching"):
        return
    db = config.dynamic_batching
    for size in db.preferred_batch_size:
        if size <= 0 or (config.max_batch_size and size > config.max_batch_size):
            raise ConfigError(
                f"{source}: field 'dynamic_batching.preferred_batch_size': {size} must be in "
                f"[1, max_batch_size={config.max_batch_size}]"
            )
    if db.priority_levels > MAX_PRIORITY_LEVELS:
        raise ConfigError(f"{source}: field 'dynamic_batching.priority_levels': {db.priority_levels} exceeds "
                          f"{MAX_PRIORITY_LEVELS}")
    level = db.default_priority_level
    if db.priority_levels and level != 0 and not 0 < level <= db.priority_levels:
        raise ConfigError(
            f"{source}: field 'dynamic_batching.default_priority_level': "
            f"{level} must be in [1, priority_levels={db.priority_levels}]"
        )
    for level in db.priority_queue_policy:
        if not 0 < level <= db.priority_levels:
            raise ConfigError(
                f"{source}: field 'dynamic_batching.priority_queue_policy': level {level} outside "
                f"[1, priority_levels={db.priority_levels}]"
            )


def tensor_wire_type(tensor: ModelTensor) -> str:
    return config_to_wire(data_type_name(tensor.data_type))


def to_json(config: ModelConfig) -> str:
    """Triton's JSON form of the config (what python models receive as args['model_config'])."""
    return str(json_format.MessageToJson(config, preserving_proto_field_name=True))
