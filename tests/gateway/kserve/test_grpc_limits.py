"""The KServe gRPC bounds: taken from the settings, defaults included, and checked."""

from __future__ import annotations

import pytest

from gateway.kserve.grpc_limits import GrpcLimits
from gateway.settings import Settings


def test_limits_come_from_the_settings() -> None:
    settings = Settings(grpc_max_message_bytes=4096, grpc_max_concurrent_rpcs=7, grpc_max_stream_inflight=3)
    assert GrpcLimits.from_settings(settings) == GrpcLimits(4096, 7, 3)
    assert GrpcLimits() == GrpcLimits(64 * 1024 * 1024, 1024, 128)


@pytest.mark.parametrize("bounds", [(1023, 1, 1), (2**31, 1, 1), (4096, 0, 1), (4096, 1, 0)])
def test_out_of_range_limits_are_refused(bounds: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        GrpcLimits(*bounds)
