"""The KServe edge's error mapping: `{"error": "..."}` with an HTTP status, or a gRPC status.

One table maps each domain `ErrorKind` to both, following Triton where Triton has
the case (INVALID_ARG 400/INVALID_ARGUMENT, NOT_FOUND 404, UNAVAILABLE 503,
INTERNAL 500, UNSUPPORTED 501/UNIMPLEMENTED, ALREADY_EXISTS 409).
"""

from __future__ import annotations

import grpc

from engines.errors import ErrorKind, SluiceError

_S = grpc.StatusCode
# kind -> (HTTP status, gRPC status code)
_TABLE: dict[ErrorKind, tuple[int, grpc.StatusCode]] = {
    ErrorKind.INVALID_ARG: (400, _S.INVALID_ARGUMENT),
    ErrorKind.CONTEXT_TOO_LONG: (400, _S.INVALID_ARGUMENT),
    ErrorKind.TOO_LARGE: (413, _S.RESOURCE_EXHAUSTED),
    ErrorKind.UNSUPPORTED: (501, _S.UNIMPLEMENTED),
    ErrorKind.NOT_FOUND: (404, _S.NOT_FOUND),
    ErrorKind.ALREADY_EXISTS: (409, _S.ALREADY_EXISTS),
    ErrorKind.UNAUTHENTICATED: (401, _S.UNAUTHENTICATED),
    ErrorKind.PERMISSION_DENIED: (403, _S.PERMISSION_DENIED),
    ErrorKind.MODEL_LOADING: (503, _S.UNAVAILABLE),
    ErrorKind.OVERLOADED: (503, _S.UNAVAILABLE),
    ErrorKind.RATE_LIMITED: (429, _S.RESOURCE_EXHAUSTED),
    ErrorKind.NO_WORKER: (503, _S.UNAVAILABLE),
    ErrorKind.UNAVAILABLE: (503, _S.UNAVAILABLE),
    ErrorKind.CANCELLED: (499, _S.CANCELLED),
    ErrorKind.INTERNAL: (500, _S.INTERNAL),
}


def http_status(exc: SluiceError) -> int:
    return _TABLE[exc.kind][0]


def grpc_status(exc: SluiceError) -> grpc.StatusCode:
    return _TABLE[exc.kind][1]


def retry_headers(exc: SluiceError) -> dict[str, str]:
    if exc.retry_after_s is not None:
        return {"Retry-After": str(max(1, round(exc.retry_after_s)))}
    return {"Retry-After": "1"} if _TABLE[exc.kind][0] in (429, 503) else {}
