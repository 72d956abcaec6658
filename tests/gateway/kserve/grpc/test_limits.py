"""The KServe gRPC bounds: taken from the settings, defaults included, and checked."""

from __future__ import annotations

import pytest

from gateway.kserve.grpc.limits import GrpcLimits
from gateway.settings import Settings


def test_limits_come_from_the_settings() -> None:
    settings = Settings(grpc_max_message_bytes=4096, grpc_max_concurrent_rpcs=7, grpc_max_stream_inflight=3)
    assert GrpcLimits.from_settings(settings) == GrpcLimits(4096, 7, 3)
    assert GrpcLimits() == GrpcLimits(64 * 1024 * 1024, 1024, 128)


def test_stream_and_message_bounds_come_from_their_settings() -> None:
    settings = Settings(stream_write_timeout_s=2.5, max_stream_buffer_bytes=8192, body_timeout_s=7.0)
    limits = GrpcLimits.from_settings(settings)
    assert (limits.stream_write_timeout_s, limits.max_stream_buffer_bytes, limits.message_timeout_s) == (2.5, 8192, 7.0)


@pytest.mark.parametrize("bounds", [(1023, 1, 1), (2**31, 1, 1), (4096, 0, 1), (4096, 1, 0), (4096, 1, 1, 0.0),
                                    (4096, 1, 1, 1.0, 4095), (4096, 1, 1, 1.0, 4096, 0.0)])
def test_out_of_range_limits_are_refused(bounds: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        GrpcLimits(*bounds)
