"""The Anthropic edge's error mapping: `{"type": "error", "error": {"type", "message"}}`.

One table turns a domain error kind into the HTTP status and Anthropic's error type, so the
`anthropic` SDK raises the right class (400 BadRequestError, 401 AuthenticationError, 403
PermissionDeniedError, 404 NotFoundError, 413, 429 RateLimitError, 529 OverloadedError) and
retries what it should. A full server, a model still loading or a fleet without a worker is
`overloaded_error` (529) with Retry-After, as Anthropic answers when it is full.
"""

from __future__ import annotations

from typing import Any

from engines.errors import ErrorKind, SluiceError

# kind -> (HTTP status, Anthropic error type, default Retry-After seconds)
_TABLE: dict[ErrorKind, tuple[int, str, float | None]] = {
    ErrorKind.INVALID_ARG: (400, "invalid_request_error", None),
    ErrorKind.CONTEXT_TOO_LONG: (400, "invalid_request_error", None),
    ErrorKind.TOO_LARGE: (413, "request_too_large", None),
    ErrorKind.UNSUPPORTED: (400, "invalid_request_error", None),
    ErrorKind.NOT_FOUND: (404, "not_found_error", None),
    ErrorKind.ALREADY_EXISTS: (409, "invalid_request_error", None),
    ErrorKind.UNAUTHENTICATED: (401, "authentication_error", None),
    ErrorKind.PERMISSION_DENIED: (403, "permission_error", None),
    ErrorKind.MODEL_LOADING: (529, "overloaded_error", 5.0),
    ErrorKind.OVERLOADED: (529, "overloaded_error", 1.0),
    ErrorKind.RATE_LIMITED: (429, "rate_limit_error", 1.0),
    ErrorKind.DEADLINE: (529, "overloaded_error", 1.0),
    ErrorKind.NO_WORKER: (529, "overloaded_error", 1.0),
    ErrorKind.UNAVAILABLE: (529, "overloaded_error", 1.0),
    ErrorKind.CANCELLED: (499, "api_error", None),
    ErrorKind.INTERNAL: (500, "api_error", None),
}
_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
              404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
              429: "rate_limit_error", 431: "request_too_large", 529: "overloaded_error"}


def is_anthropic(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def body(err_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": err_type, "message": message}}


def of(exc: SluiceError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) of a domain error."""
    status, err_type, retry_after_s = _TABLE[exc.kind]
    retry = exc.retry_after_s if exc.retry_after_s is not None else retry_after_s
    headers = {"Retry-After": str(max(1, round(retry)))} if retry is not None else {}
    if exc.kind is ErrorKind.UNAUTHENTICATED:
        headers["WWW-Authenticate"] = "Bearer"
    return status, body(err_type, exc.message), headers


def of_status(status: int, message: str) -> dict[str, Any]:
    """The body of a bare HTTP status (Starlette's 404/405, the protocol layer's 431)."""
    return body(_BY_STATUS.get(status, "api_error" if status >= 500 else "invalid_request_error"), message)


def stream_error(exc: BaseException) -> dict[str, Any]:
    """The `error` event of a stream that already started."""
    if isinstance(exc, SluiceError):
        return of(exc)[1]
    return body("api_error", "internal error while streaming")
