"""Typed views of the `tritonclient.grpc.model_config_pb2` messages the classic path reads.

tritonclient's generated protobuf code ships without type information, so to a type
checker every message is `Any`. These Protocols declare the fields Sluice uses, with
the types protobuf gives them at run time (repeated fields are sequences, map fields
mappings, enums ints); annotating with them lets mypy check every field access. A
field not declared here is a type error: add it when the code starts reading it.

Only the constructors and enum helpers below touch `model_config_pb2` directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from tritonclient.grpc import model_config_pb2 as _mc

TYPE_INVALID: int = _mc.TYPE_INVALID
QUEUE_POLICY_REJECT: int = _mc.ModelQueuePolicy.REJECT


class Message(Protocol):
    def HasField(self, field_name: str) -> bool: ...


class Reshape(Protocol):
    shape: Sequence[int]


class ModelTensor(Message, Protocol):
    """A `ModelInput` or a `ModelOutput`: the fields both have."""

    name: str
    data_type: int  # a DataType enum value
    dims: Sequence[int]
    reshape: Reshape


class ModelInput(ModelTensor, Protocol):
    optional: bool
    allow_ragged_batch: bool


class ModelOutput(ModelTensor, Protocol):
    pass


class InstanceGroup(Protocol):
    count: int


class ModelQueuePolicy(Protocol):
    timeout_action: int  # REJECT or DELAY
    default_timeout_microseconds: int
    allow_timeout_override: bool
    max_queue_size: int


class DynamicBatching(Protocol):
    preferred_batch_size: Sequence[int]
    max_queue_delay_microseconds: int
    priority_levels: int
    default_priority_level: int
    default_queue_policy: ModelQueuePolicy
    priority_queue_policy: Mapping[int, ModelQueuePolicy]


class EnsembleStep(Protocol):
    model_name: str
    model_version: int  # -1: the latest
    input_map: Mapping[str, str]  # the step model's input -> ensemble tensor
    output_map: Mapping[str, str]  # the step model's output -> ensemble tensor


class EnsembleScheduling(Protocol):
    step: Sequence[EnsembleStep]


class LatestVersions(Protocol):
    num_versions: int


class SpecificVersions(Protocol):
    versions: Sequence[int]


class VersionPolicy(Protocol):
    latest: LatestVersions
    specific: SpecificVersions

    def WhichOneof(self, oneof_group: str) -> str | None: ...


class Parameter(Protocol):
    string_value: str


class ModelConfig(Message, Protocol):
    name: str
    platform: str
    backend: str
    max_batch_size: int
    version_policy: VersionPolicy
    input: Sequence[ModelInput]
    output: Sequence[ModelOutput]
    instance_group: Sequence[InstanceGroup]
    default_model_filename: str
    dynamic_batching: DynamicBatching
    ensemble_scheduling: EnsembleScheduling
    parameters: Mapping[str, Parameter]


def new_model_config() -> ModelConfig:
    """An empty ModelConfig message, to parse into."""
    config: ModelConfig = _mc.ModelConfig()
    return config


def data_type_name(data_type: int) -> str:
    """'TYPE_FP32' for the DataType enum value of FP32."""
    return str(_mc.DataType.Name(data_type))
