"""A real OTLP/HTTP trace receiver for tests: `POST /v1/traces` with a protobuf
`ExportTraceServiceRequest` (gzip or not), parsed with the opentelemetry-proto package.

It is the receiving end of the protocol, like a collector's OTLP receiver, and keeps every
span it was sent, flattened to `ReceivedSpan`s (ids as hex, attributes as plain values).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.servers import free_port


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    status_code: int  # 0 unset, 1 ok, 2 error
    attributes: dict[str, Any] = field(default_factory=dict)
    events: tuple[str, ...] = ()


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.port = free_port()
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver._add(ExportTraceServiceRequest.FromString(body))
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _add(self, request: ExportTraceServiceRequest) -> None:
        out = []
        for rs in request.resource_spans:
            attrs = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(ReceivedSpan(
                        str(attrs.get("service.name", "")), s.name, s.trace_id.hex(), s.span_id.hex(),
                        s.parent_span_id.hex(), s.kind, s.status.code,
                        {a.key: _value(a.value) for a in s.attributes}, tuple(e.name for e in s.events)))
        with self._lock:
            self.requests += 1
            self.spans.extend(out)

    def wait_for(self, condition: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 30.0
                 ) -> list[ReceivedSpan]:
        """All spans received, once `condition(spans)` holds (AssertionError after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                spans = list(self.spans)
            if condition(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met after {timeout_s} s; received: "
                                     f"{[(s.service, s.name, s.trace_id[:8]) for s in spans]}")
            time.sleep(0.1)
