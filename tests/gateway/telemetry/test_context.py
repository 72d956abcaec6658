"""The request context read from a request's headers: which X-Request-Id values are kept, and which
W3C traceparent and tracestate values are continued (https://www.w3.org/TR/trace-context/); every
other value is ignored. And the log filter that puts the current request's ids on every record."""

from __future__ import annotations

import io
import json
import logging

import pytest

from gateway import logs
from gateway.telemetry import context
from gateway.telemetry.context import TraceParent, from_headers, parse_traceparent, parse_tracestate

TRACE, SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


@pytest.mark.parametrize("value", ["abc-123", "req_01HZX8", "chatcmpl-9f86d081.884c:7d65", "x" * 128])
def test_well_formed_request_ids_are_kept(value: str) -> None:
    assert from_headers(value, None, None).request_id == value


@pytest.mark.parametrize("value", [None, "", "x" * 129, "two words", "a\tb", "semi;colon", "quote\"d", "ünï",
                                   "a,b", "<script>"])
def test_other_request_ids_are_replaced(value: str | None) -> None:
    rid = from_headers(value, None, None).request_id
    assert rid != value and len(rid) == 32 and int(rid, 16) >= 0


def test_a_valid_traceparent_is_the_parent_and_its_trace_the_requests() -> None:
    ctx = from_headers(None, f"00-{TRACE}-{SPAN}-01", "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE")
    assert ctx.parent == TraceParent(TRACE, SPAN, 1, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
    assert ctx.trace_id == TRACE
    assert ctx.parent.headers() == {"traceparent": f"00-{TRACE}-{SPAN}-01",
                                    "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"}
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-00") == TraceParent(TRACE, SPAN, 0)  # not sampled


def test_a_later_version_is_read_as_far_as_version_00_goes() -> None:
    assert parse_traceparent(f"cc-{TRACE}-{SPAN}-01-what-comes-later") == TraceParent(TRACE, SPAN, 1)


@pytest.mark.parametrize("value", [
    "", "garbage", f"00-{TRACE}-{SPAN}", f"00-{TRACE}-{SPAN}-01-extra", f"ff-{TRACE}-{SPAN}-01",
    f"00-{'0' * 32}-{SPAN}-01", f"00-{TRACE}-{'0' * 16}-01", f"00-{TRACE.upper()}-{SPAN}-01",
    f"00-{TRACE[:-1]}-{SPAN}-01", f"00-{TRACE}-{SPAN}-1", f"0-{TRACE}-{SPAN}-01", f"00_{TRACE}_{SPAN}_01",
    f"cc-{TRACE}-{SPAN}-01x", f"cc-{TRACE}-{SPAN}-01-" + "a" * 600,
])
def test_invalid_traceparents_are_no_parent(value: str) -> None:
    ctx = from_headers("r", value, "k=v")
    assert ctx.parent is None and ctx.trace_id is None


@pytest.mark.parametrize("value", ["", "no-equals", "A=upper", "k=v,k=w", "k=", "k=ctl\x01", "k=a,b",
                                   ",".join(f"k{i}=v" for i in range(33)), "k=" + "v" * 600])
def test_invalid_tracestates_are_dropped_whole(value: str) -> None:
    assert parse_tracestate(value) is None
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-01", value) == TraceParent(TRACE, SPAN, 1)


def test_log_records_carry_the_current_requests_ids_only_while_it_is_current() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    handler.addFilter(logs.RequestFilter())
    logger = logging.getLogger("tests.some.module")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        token = context.enter(from_headers("rid-7", f"00-{TRACE}-{SPAN}-01", None))
        try:
            logger.info("inside")
            logger.info("own id kept", extra={"request_id": "explicit"})
        finally:
            context.leave(token)
        logger.info("outside")
    finally:
        logger.removeHandler(handler)
    inside, explicit, outside = (json.loads(line) for line in out.getvalue().splitlines())
    assert (inside["request_id"], inside["trace_id"]) == ("rid-7", TRACE)
    assert (explicit["request_id"], explicit["trace_id"]) == ("explicit", TRACE)
    assert "request_id" not in outside and "trace_id" not in outside


def test_text_lines_end_with_the_ids_before_a_traceback() -> None:
    record = logging.LogRecord("x", logging.ERROR, "", 0, "failed", None, None)
    record.request_id, record.trace_id = "rid-7", TRACE
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        record.exc_info = sys.exc_info()
    first, *rest = logs.TextFormatter().format(record).splitlines()
    assert first.endswith(f"failed request_id=rid-7 trace_id={TRACE}") and "RuntimeError: boom" in rest[-1]
