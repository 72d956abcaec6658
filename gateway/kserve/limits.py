"""The KServe gRPC server's bounds, in a module light enough for the settings to import."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    max_message_bytes: int = 64 * 1024 * 1024  # each way; a larger message gets RESOURCE_EXHAUSTED
    max_concurrent_rpcs: int = 1024  # RPCs in progress at once, streams included
    max_stream_inflight: int = 128  # requests of one ModelStreamInfer stream running or awaiting delivery

    def __post_init__(self) -> None:
        if not 1024 <= self.max_message_bytes <= 2**31 - 1:
            raise ValueError(f"max_message_bytes must be in [1024, 2**31 - 1], got {self.max_message_bytes}")
        if self.max_concurrent_rpcs < 1 or self.max_stream_inflight < 1:
            raise ValueError("max_concurrent_rpcs and max_stream_inflight must be >= 1")
