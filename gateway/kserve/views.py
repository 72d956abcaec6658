"""Protocol views of the manager's state, built once as gRPC messages; HTTP returns their JSON form."""

from __future__ import annotations

from collections.abc import Set
from typing import Any, Protocol

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from engines.classic.errors import InferError
from engines.classic.manager import ModelRepositoryManager
from engines.classic.repository.config import tensor_wire_type
from engines.classic.repository.names import check_model_name
from engines.classic.repository.protojson import fix_int64
from engines.classic.stats import Duration, StatsSnapshot
from engines.errors import ErrorKind
from gateway.llm.registry import LLMModel

SERVER_NAME = "sluice"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ["classification", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
              "model_configuration", "statistics", "binary_tensor_data", "generate"]


class LLMModels(Protocol):
    """What the KServe side reads of the LLMs the gateway serves (`gateway.llm.registry.ModelRegistry`).

    Read only. `pending` holds names still loading, which the LLM path answers with 503
    (MODEL_LOADING) rather than 404; `get` raises a SluiceError for a name it does not serve."""

    @property
    def pending(self) -> Set[str]: ...

    def has(self, name: str) -> bool: ...

    def names(self) -> list[str]: ...

    def get(self, name: str) -> LLMModel: ...


def to_dict(message: Any) -> dict[str, Any]:
    """Triton-style JSON: snake_case, defaults included, 64-bit ints as numbers."""
    data = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)
    return fix_int64(message.DESCRIPTOR, data)


def _duration(d: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def model_statistics(s: StatsSnapshot) -> pb.ModelStatistics:
    return pb.ModelStatistics(
        name=s.name, version=s.version, last_inference=s.last_inference_ms, inference_count=s.inference_count,
        execution_count=s.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(s.success), fail=_duration(s.fail), queue=_duration(s.queue),
            compute_input=_duration(s.compute_input), compute_infer=_duration(s.compute_infer),
            compute_output=_duration(s.compute_output)),
        batch_stats=[pb.InferBatchStatistics(batch_size=size, compute_input=_duration(b.compute_input),
                                             compute_infer=_duration(b.compute_infer),
                                             compute_output=_duration(b.compute_output))
                     for size, b in sorted(s.batch_stats.items())],
    )


def statistics_response(snaps: list[StatsSnapshot]) -> pb.ModelStatisticsResponse:
    return pb.ModelStatisticsResponse(model_stats=[model_statistics(s) for s in snaps])


def _tensor_meta(config: mc.ModelConfig, tensor: Any) -> pb.ModelMetadataResponse.TensorMetadata:
    shape = ([-1] if config.max_batch_size > 0 else []) + list(tensor.dims)
    return pb.ModelMetadataResponse.TensorMetadata(name=tensor.name, datatype=tensor_wire_type(tensor), shape=shape)


def model_metadata(manager: ModelRepositoryManager, llms: LLMModels, name: str,
                   version: str) -> pb.ModelMetadataResponse:
    if is_llm(manager, llms, check_model_name(name)):
        meta = pb.ModelMetadataResponse(name=name, versions=["1"], platform="llm")
        meta.inputs.add(name="text_input", datatype="BYTES", shape=[1])
        meta.outputs.add(name="text_output", datatype="BYTES", shape=[-1])
        return meta
    model = manager.get_version(name, version or None)
    config = model.config
    ready = sorted((r["version"] for r in manager.repository_index(ready_only=True) if r["name"] == name), key=int)
    return pb.ModelMetadataResponse(
        name=name, versions=ready, platform=config.platform or config.backend,
        inputs=[_tensor_meta(config, t) for t in config.input],
        outputs=[_tensor_meta(config, t) for t in config.output])


def model_config(manager: ModelRepositoryManager, llms: LLMModels, name: str, version: str) -> mc.ModelConfig:
    if is_llm(manager, llms, check_model_name(name)):
        config = manager.llm_model_configs().get(name)
        return config if config is not None else mc.ModelConfig(name=name, backend="llm")
    return manager.model_config(name, version or None)


def model_ready(manager: ModelRepositoryManager, llms: LLMModels, name: str, version: str) -> bool:
    """Whether the model serves; raises InferError(INVALID_ARG) for a name that is not a model name."""
    if is_llm(manager, llms, check_model_name(name)):
        return llms.has(name) and llms.get(name).backend.ready()
    return manager.model_ready(name, version or None)


def is_llm(manager: ModelRepositoryManager, llms: LLMModels, name: str) -> bool:
    """Served by the LLM path: a registered LLM, or a name still loading that the
    classic manager does not hold (so the LLM path answers MODEL_LOADING, 503).
    The LLM names are asked first: a classic infer looks its model up in the manager once."""
    return (llms.has(name) or name in llms.pending) and name not in manager.model_names()


def repository_index(manager: ModelRepositoryManager, llms: LLMModels, ready_only: bool) -> list[dict[str, str]]:
    rows = manager.repository_index(ready_only)
    rows += [{"name": n, "version": "1", "state": "READY", "reason": ""} for n in llms.names()]
    return sorted(rows, key=lambda r: (r["name"], r["version"]))


def server_metadata() -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS)


def bad_param(name: str, value: Any, kind: str) -> InferError:
    return InferError(f"parameter '{name}' must be {kind}, got {value!r}", ErrorKind.INVALID_ARG)


def int_param(params: dict[str, Any], name: str) -> int:
    value = params.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_param(name, value, "a non-negative integer")
    return value
