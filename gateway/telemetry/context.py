"""The context of one HTTP request: its request id and W3C trace context, read once at the edge.

`SluiceMiddleware` builds a `RequestContext` from the request's headers and sets it as the
current one for as long as the request is handled (responses and streams included). Log
records read it (`gateway.logs`), the LLM layer continues its trace parent and sends its
request id to the worker (`gateway.llm.service`), and latency histograms take its trace id as
an exemplar. Everything here is pure and needs no OpenTelemetry.

Header values are the client's: a request id outside `REQUEST_ID_CHARS` or longer than
`MAX_REQUEST_ID_CHARS`, and a `traceparent` that is not a valid W3C Trace Context one, are
ignored (a fresh id; no parent), never an error and never echoed.
"""

from __future__ import annotations

import re
import secrets
from contextvars import ContextVar
from dataclasses import dataclass

MAX_REQUEST_ID_CHARS = 128
# UUIDs, ULIDs, `req_…`, `chatcmpl-…`; nothing a header, a log line or a worker's id could split on.
REQUEST_ID_CHARS = "A-Z a-z 0-9 . _ : -"
_REQUEST_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_REQUEST_ID_CHARS}}}")
# version-trace_id-parent_id-flags, lower-case hex; a later version may append "-..." fields.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
MAX_TRACEPARENT_CHARS = 512
MAX_TRACESTATE_CHARS = 512  # the W3C recommendation: a vendor may drop a longer tracestate whole
_TRACESTATE_MEMBERS = 32
_TRACESTATE_VALUE_END = r"\x21-\x2b\x2d-\x3c\x3e-\x7e"  # printable ASCII but "," and "="
_TRACESTATE_MEMBER = re.compile(rf"[a-z0-9][a-z0-9_*/@-]{{0,255}}=[\x20{_TRACESTATE_VALUE_END}]{{0,255}}"
                                rf"[{_TRACESTATE_VALUE_END}]")


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A caller's W3C trace context (https://www.w3.org/TR/trace-context/)."""

    trace_id: str  # 32 lower-case hex digits, not all zero
    span_id: str  # the caller's span: 16 lower-case hex digits, not all zero
    flags: int  # bit 0: sampled
    tracestate: str | None = None  # the caller's vendor entries, passed on unchanged; None if absent or invalid

    def headers(self) -> dict[str, str]:
        """The headers that pass this context on unchanged."""
        out = {"traceparent": f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"}
        if self.tracestate:
            out["tracestate"] = self.tracestate
        return out


@dataclass(slots=True)
class RequestContext:
    """What every log line, span and worker call of one request carries. Mutable only in
    `trace_id`: set when the LLM layer starts the request's trace (no caller's parent)."""

    request_id: str
    parent: TraceParent | None = None
    trace_id: str | None = None  # the trace this request belongs to, once there is one


_CURRENT: ContextVar[RequestContext | None] = ContextVar("sluice_request", default=None)


def current() -> RequestContext | None:
    """The context of the request being handled in this task (None outside any request)."""
    return _CURRENT.get()


def enter(context: RequestContext) -> object:
    """Make `context` current; returns the token `leave` takes."""
    return _CURRENT.set(context)


def leave(token: object) -> None:
    _CURRENT.reset(token)  # type: ignore[arg-type]


def from_headers(request_id: str | None, traceparent: str | None, tracestate: str | None) -> RequestContext:
    """The context of a request that sent these headers (None: absent; several values: invalid)."""
    parent = parse_traceparent(traceparent, tracestate)
    if request_id is None or not valid_request_id(request_id):
        request_id = new_request_id()
    return RequestContext(request_id, parent, parent.trace_id if parent is not None else None)


def new_request_id() -> str:
    return secrets.token_hex(16)  # uuid4().hex's shape, cheaper


def valid_request_id(value: str | None) -> bool:
    return value is not None and _REQUEST_ID.fullmatch(value) is not None


def parse_traceparent(value: str | None, tracestate: str | None = None) -> TraceParent | None:
    """The caller's context, or None for a header that is absent or not valid Trace Context."""
    if value is None or len(value) > MAX_TRACEPARENT_CHARS:
        return None
    m = _TRACEPARENT.fullmatch(value.strip(" \t"))
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    # Version ff is forbidden; version 00 has exactly four fields; a later one may have more.
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return TraceParent(trace_id, span_id, int(flags, 16) & 0x01, parse_tracestate(tracestate))


def parse_tracestate(value: str | None) -> str | None:
    """The tracestate to pass on: the caller's, when it is a valid list of at most 32 members within
    `MAX_TRACESTATE_CHARS`; else None (dropped whole, as the W3C allows)."""
    if not value or len(value) > MAX_TRACESTATE_CHARS:
        return None
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if not members or len(members) > _TRACESTATE_MEMBERS:
        return None
    if any(_TRACESTATE_MEMBER.fullmatch(m) is None for m in members):
        return None
    keys = [m.split("=", 1)[0] for m in members]
    if len(set(keys)) != len(keys):
        return None
    return ",".join(members)
