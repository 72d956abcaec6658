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
    # Authenticated RPCs in progress at once, streams included (ServerLive/ServerReady are not counted:
    # they neither read their message nor wait); beyond it RESOURCE_EXHAUSTED.
    max_concurrent_rpcs: int = _DEFAULTS["grpc_max_concurrent_rpcs"].default
    # Requests of one ModelStreamInfer stream running or awaiting delivery.
    max_stream_inflight: int = _DEFAULTS["grpc_max_stream_inflight"].default
    # A stream's write the client has not taken for this long ends the stream (DEADLINE_EXCEEDED) ...
    stream_write_timeout_s: float = _DEFAULTS["stream_write_timeout_s"].default
    # ... as do this many bytes of answers queued behind it (RESOURCE_EXHAUSTED).
    max_stream_buffer_bytes: int = _DEFAULTS["max_stream_buffer_bytes"].default
    # A unary call's request message must arrive within this (HTTP's body timeout), or DEADLINE_EXCEEDED.
    message_timeout_s: float = _DEFAULTS["body_timeout_s"].default

    def __post_init__(self) -> None:
        if not 1024 <= self.max_message_bytes <= 2**31 - 1:
            raise ValueError(f"max_message_bytes must be in [1024, 2**31 - 1], got {self.max_message_bytes}")
        if self.max_concurrent_rpcs < 1 or self.max_stream_inflight < 1:
            raise ValueError("max_concurrent_rpcs and max_stream_inflight must be >= 1")
        if not (self.stream_write_timeout_s > 0 and self.message_timeout_s > 0):
            raise ValueError("stream_write_timeout_s and message_timeout_s must be > 0")
        if self.max_stream_buffer_bytes < 4096:
            raise ValueError(f"max_stream_buffer_bytes must be >= 4096, got {self.max_stream_buffer_bytes}")

    @classmethod
    def from_settings(cls, settings: Settings) -> GrpcLimits:
        return cls(settings.grpc_max_message_bytes, settings.grpc_max_concurrent_rpcs,
                   settings.grpc_max_stream_inflight, settings.stream_write_timeout_s,
                   settings.max_stream_buffer_bytes, settings.body_timeout_s)
