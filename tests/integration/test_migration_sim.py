"""Streams survive their worker under load: 200 concurrent streamed chats over three sim workers,
one of them (a third) SIGKILLed at a random point mid-run. With the gateway's defaults every stream
completes as one stream: one id, no error event, `finish_reason` length and exactly `max_tokens`
tokens in its usage; the gateway counts each moved stream as resumed. The scenario is
loadtests/faults/bench_migration.py's (which also reports the pauses, and runs without migration
beside it); here it is checked, not timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests.faults.bench_migration import run_scenario

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_every_stream_completes_when_a_third_of_the_workers_die_mid_run(tmp_path: Path) -> None:
    report = await run_scenario(tmp_path, workers=3, streams=200, kill=1, max_tokens=64, step_s=0.03,
                                migrate=True, seed=1)
    assert report["endings"] == {"completed": 200}, (report["endings"], report["gateway"])
    assert len(report["kills"]) == 1
    moved = report["streams_on_killed_workers"]
    assert moved > 0, "no stream was on the killed worker"
    # The streams the dead worker still held were resumed (one that had finished before the kill was
    # not); any other outcome would have ended a stream.
    migrations = report["gateway"]["migrations"]
    assert set(migrations) <= {"broken:resumed", "stalled:resumed"}, migrations
    assert 0 < sum(migrations.values()) <= moved
    assert report["gateway"]["pauses_counted"] == sum(migrations.values())
