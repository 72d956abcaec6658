"""The KServe edge's error mapping: `{"error": "..."}` with an HTTP status, or a gRPC status.

One table maps each domain `ErrorKind` to both, following Triton where Triton has
the case (INVALID_ARG 400/INVALID_ARGUMENT, NOT_FOUND 404, UNAVAILABLE 503,
INTERNAL 500, UNSUPPORTED 501/UNIMPLEMENTED, ALREADY_EXISTS 409). `ErrorReply` is
the one builder of the HTTP answer; the FastAPI routes, the exception handlers, the
middleware and the pure-ASGI infer route all answer with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson
from grpc import StatusCode

from engines.errors import ErrorKind, SluiceError

# kind -> (HTTP status, gRPC status code)
_TABLE: dict[ErrorKind, tuple[int, StatusCode]] = {
    ErrorKind.INVALID_ARG: (400, StatusCode.INVALID_ARGUMENT),
    ErrorKind.CONTEXT_TOO_LONG: (400, StatusCode.INVALID_ARGUMENT),
    ErrorKind.TOO_LARGE: (413, StatusCode.RESOURCE_EXHAUSTED),
    ErrorKind.UNSUPPORTED: (501, StatusCode.UNIMPLEMENTED),
    ErrorKind.NOT_FOUND: (404, StatusCode.NOT_FOUND),
    ErrorKind.ALREADY_EXISTS: (409, StatusCode.ALREADY_EXISTS),
    ErrorKind.UNAUTHENTICATED: (401, StatusCode.UNAUTHENTICATED),
    ErrorKind.PERMISSION_DENIED: (403, StatusCode.PERMISSION_DENIED),
    ErrorKind.MODEL_LOADING: (503, StatusCode.UNAVAILABLE),
    ErrorKind.OVERLOADED: (503, StatusCode.UNAVAILABLE),
    ErrorKind.RATE_LIMITED: (429, StatusCode.RESOURCE_EXHAUSTED),
    ErrorKind.DEADLINE: (503, StatusCode.RESOURCE_EXHAUSTED),
    ErrorKind.NO_WORKER: (503, StatusCode.UNAVAILABLE),
    ErrorKind.UNAVAILABLE: (503, StatusCode.UNAVAILABLE),
    ErrorKind.CANCELLED: (499, StatusCode.CANCELLED),
    ErrorKind.INTERNAL: (500, StatusCode.INTERNAL),
}


def grpc_status(exc: SluiceError) -> StatusCode:
    return _TABLE[exc.kind][1]


def error_body(message: str) -> dict[str, str]:
    """Triton's error JSON (also the in-band error event of a generate stream)."""
    return {"error": message}


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """One KServe error answer over HTTP: its status, `{"error": message}` and its headers."""

    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, exc: SluiceError) -> ErrorReply:
        status = _TABLE[exc.kind][0]
        if exc.retry_after_s is not None:
            return cls(status, exc.message, {"Retry-After": str(max(1, round(exc.retry_after_s)))})
        return cls(status, exc.message, {"Retry-After": "1"} if status in (429, 503) else {})

    def body(self) -> dict[str, str]:
        return error_body(self.message)

    def body_bytes(self) -> bytes:
        """The body as FastAPI's JSONResponse renders it (compact UTF-8)."""
        return orjson.dumps(self.body())

    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """Content type and headers as an ASGI `http.response.start` message carries them."""
        return [(b"content-type", b"application/json"),
                *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items())]
