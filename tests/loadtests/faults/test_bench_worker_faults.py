"""What loadtests/faults/bench_worker_faults.py makes of a stream's end and of a run's rounds."""

from __future__ import annotations

import json
from typing import Any

from loadtests.faults.bench_worker_faults import Stream, summarize

CHUNK = json.dumps({"choices": [{"delta": {"content": "x"}, "finish_reason": None}]})
LAST = json.dumps({"choices": [{"delta": {}, "finish_reason": "length"}]})
ERROR = json.dumps({"error": {"message": "worker connection lost", "type": "server_error"}})


def _stream(payloads: list[str], failure: str | None = None) -> Stream:
    s = Stream(kill_after=1)
    s.payloads, s.failure = payloads, failure
    return s


def test_how_a_stream_ended() -> None:
    assert _stream([CHUNK, ERROR, "[DONE]"]).ending() == "error_then_done"
    assert _stream([CHUNK, LAST, "[DONE]"]).ending() == "done"
    assert _stream([CHUNK, LAST, "[DONE]"]).finish_reason() == "length"
    assert _stream([CHUNK]).ending() == "closed"
    assert _stream([CHUNK], failure="RemoteProtocolError").ending() == "failed: RemoteProtocolError"


def _round(took: float | None, *, moved: bool = True, other: str = "done") -> dict[str, Any]:
    return {"ended": took is not None, "kill_to_end_s": took, "ending": "error_then_done" if took else "still open",
            "traffic_moved": moved, "other_stream": {"ending": other, "finish_reason": "length"}, "retries": 1.0}


def test_a_run_passes_when_every_stream_ended_and_traffic_moved_whatever_the_times() -> None:
    s = summarize([_round(0.05), _round(0.1), _round(3.0)], bound_s=2.0)
    assert s["passed"] and s["streams_ended"] == 3 and s["rounds_over_bound"] == 1
    assert s["kill_to_end_s"] == {"p50": 0.1, "p99": 3.0, "max": 3.0, "min": 0.05}
    assert s["endings"] == {"error_then_done": 3} and s["retries"] == 3.0


def test_a_stream_left_open_a_failed_probe_or_a_broken_other_stream_fails_the_run() -> None:
    assert not summarize([_round(0.05), _round(None)], bound_s=2.0)["passed"]
    assert not summarize([_round(0.05, moved=False)], bound_s=2.0)["passed"]
    assert not summarize([_round(0.05, other="closed")], bound_s=2.0)["passed"]
    assert not summarize([], bound_s=2.0)["passed"]
