"""The KServe gRPC server's bounds (`GrpcLimits`), beside the server that applies them.

Their defaults live in `gateway.settings.Settings`, with the flags and `SLUICE_*`
variables that set them: the settings cannot import this package (it reads the
settings, so that would be a cycle), so these bounds read theirs from there.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.settings import Settings

_DEFAULTS = Settings.model_fields


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    # Each way; a larger message gets RESOURCE_EXHAUSTED.
    max_message_bytes: int = _DEFAULTS["grpc_max_message_bytes"].default
    # RPCs in progress at once, streams included.
    max_concurrent_rpcs: int = _DEFAULTS["grpc_max_concurrent_rpcs"].default
    # Requests of one ModelStreamInfer stream running or awaiting delivery.
    max_stream_inflight: int = _DEFAULTS["grpc_max_stream_inflight"].default

    def __post_init__(self) -> None:
        if not 1024 <= self.max_message_bytes <= 2**31 - 1:
            raise ValueError(f"max_message_bytes must be in [1024, 2**31 - 1], got {self.max_message_bytes}")
        if self.max_concurrent_rpcs < 1 or self.max_stream_inflight < 1:
            raise ValueError("max_concurrent_rpcs and max_stream_inflight must be >= 1")

    @classmethod
    def from_settings(cls, settings: Settings) -> GrpcLimits:
        return cls(settings.grpc_max_message_bytes, settings.grpc_max_concurrent_rpcs,
                   settings.grpc_max_stream_inflight)
