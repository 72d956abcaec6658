"""What loadtests/faults/bench_migration.py counts as a stream that completed whole."""

from __future__ import annotations

import json

from loadtests.faults.bench_migration import Stream, _take


def _read(*events: dict | str, status: int = 200) -> Stream:
    s = Stream(0, status=status)
    for e in events:
        _take(s, e if isinstance(e, str) else json.dumps(e))
    return s


def _chunk(text: str, cid: str = "chatcmpl-1", finish: str | None = None) -> dict:
    return {"id": cid, "choices": [{"delta": {"content": text}, "finish_reason": finish}]}


USAGE = {"id": "chatcmpl-1", "choices": [], "usage": {"completion_tokens": 3}}


def test_one_id_no_error_the_finish_and_the_exact_count_make_a_whole_stream() -> None:
    assert _read(_chunk("a"), _chunk("b"), _chunk("c", finish="length"), USAGE, "[DONE]").complete(3)
    assert _read(_chunk("a"), _chunk("b"), _chunk("c", finish="length"), USAGE, "[DONE]").longest_gap_s() >= 0


def test_anything_else_is_not() -> None:
    whole = [_chunk("a"), _chunk("b"), _chunk("c", finish="length"), USAGE, "[DONE]"]
    assert not _read(*whole).complete(4)  # a token short
    assert not _read(*whole[:-1]).complete(3)  # no [DONE]
    assert not _read(_chunk("a"), _chunk("b", cid="chatcmpl-2"), *whole[2:]).complete(3)  # two streams
    assert not _read(_chunk("a"), {"error": {"message": "worker lost", "type": "server_error"}}, "[DONE]").complete(3)
    assert not _read(*whole, status=503).complete(3)
