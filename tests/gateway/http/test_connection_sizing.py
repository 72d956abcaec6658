"""The derived in-flight cap (fds: 2 per stream; memory) and the listen backlog."""

from __future__ import annotations

import logging
import resource

import pytest

from gateway.http.connections import (
    FD_RESERVE,
    MIN_INFLIGHT,
    derived_inflight,
    inflight_limit,
    listen_backlog,
    memory_bytes,
    raise_fd_limit,
)

GIB = 1 << 30


def test_the_fd_limit_bounds_streams_at_two_fds_each() -> None:
    assert derived_inflight(1024, 64 * GIB) == (1024 - FD_RESERVE) // 2
    assert derived_inflight(1 << 20, 64 * GIB) == 64 * GIB // 2 // (256 * 1024)  # then memory binds


def test_a_common_host_is_sized_for_ten_thousand_streams_and_more() -> None:
    assert derived_inflight(65536, 8 * GIB) >= 10_000
    assert derived_inflight(1 << 20, 16 * GIB) > derived_inflight(65536, 8 * GIB)
    assert derived_inflight(1 << 20, 16 * GIB, processes=2) == derived_inflight(1 << 20, 8 * GIB)


def test_never_below_the_floor() -> None:
    assert derived_inflight(300, GIB) == MIN_INFLIGHT


def test_an_explicit_cap_wins_and_the_derived_one_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    assert inflight_limit(77) == 77
    inflight_limit.cache_clear()  # derived once per process
    with caplog.at_level(logging.INFO, logger="sluice.server"):
        derived = inflight_limit(None)
    assert derived == derived_inflight(raise_fd_limit(), memory_bytes(), 1)
    assert f"in-flight requests capped at {derived}" in caplog.text


def test_the_soft_fd_limit_is_raised_to_the_hard_one_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 1024:
        pytest.skip("needs a finite hard fd limit above 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        with caplog.at_level(logging.INFO, logger="sluice.server"):
            assert raise_fd_limit() == min(hard, 1 << 20)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == min(hard, 1 << 20)
        assert f"fd limit raised from 1024 to {min(hard, 1 << 20)}" in caplog.text
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_backlog_takes_bursts() -> None:
    assert 4096 <= listen_backlog() <= 65535

