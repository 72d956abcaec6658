"""The OpenAI edge's error mapping: `{"error": {"message", "type", "param", "code"}}`.

Below this edge every failure is a domain error (`engines.errors.SluiceError`
with an `ErrorKind`); this module's one table turns a kind into the HTTP status,
the OpenAI `type` and a default `code`, so the SDKs raise the right exception
class (400 → BadRequestError, 401 → AuthenticationError, 404 → NotFoundError,
429 → RateLimitError, 5xx → InternalServerError).
"""

from __future__ import annotations

from typing import Any

from engines.errors import ErrorKind, SluiceError

# kind -> (HTTP status, OpenAI error type, default code, default Retry-After seconds)
_TABLE: dict[ErrorKind, tuple[int, str, str | None, float | None]] = {
    ErrorKind.INVALID_ARG: (400, "invalid_request_error", None, None),
    ErrorKind.CONTEXT_TOO_LONG: (400, "invalid_request_error", "context_length_exceeded", None),
    ErrorKind.TOO_LARGE: (413, "invalid_request_error", "request_too_large", None),
    ErrorKind.UNSUPPORTED: (400, "invalid_request_error", "unsupported_parameter", None),
    ErrorKind.NOT_FOUND: (404, "invalid_request_error", "not_found", None),
    ErrorKind.ALREADY_EXISTS: (409, "invalid_request_error", "conflict", None),
    ErrorKind.UNAUTHENTICATED: (401, "invalid_request_error", "invalid_api_key", None),
    ErrorKind.PERMISSION_DENIED: (403, "permission_error", "permission_denied", None),
    ErrorKind.MODEL_LOADING: (503, "server_error", "model_loading", 5.0),
    ErrorKind.OVERLOADED: (503, "server_error", "queue_full", 1.0),
    ErrorKind.RATE_LIMITED: (429, "rate_limit_error", "rate_limit_exceeded", 1.0),
    ErrorKind.DEADLINE: (503, "server_error", "deadline_unmeetable", 1.0),
    ErrorKind.NO_WORKER: (503, "server_error", "no_worker", 1.0),
    ErrorKind.UNAVAILABLE: (503, "server_error", "unavailable", 1.0),
    ErrorKind.CANCELLED: (499, "invalid_request_error", "client_closed_request", None),
    ErrorKind.INTERNAL: (500, "server_error", None, None),
}


class OpenAIError(Exception):
    """An error in OpenAI's shape; built at the edge from a domain error, never raised below it."""

    def __init__(self, status_code: int, message: str, *, err_type: str, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.err_type = err_type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.code}}

    @classmethod
    def of(cls, exc: SluiceError) -> OpenAIError:
        status, err_type, code, retry_after_s = _TABLE[exc.kind]
        retry = exc.retry_after_s if exc.retry_after_s is not None else retry_after_s
        headers = {"Retry-After": str(max(1, round(retry)))} if retry is not None else {}
        if exc.kind is ErrorKind.UNAUTHENTICATED:
            headers["WWW-Authenticate"] = "Bearer"
        return cls(status, exc.message, err_type=err_type, code=exc.code or code, param=exc.param, headers=headers)

    @classmethod
    def of_status(cls, status_code: int, message: str, code: str | None = None) -> OpenAIError:
        """For failures that reach the edge as a bare HTTP status (Starlette's 404/405)."""
        kind = next((k for k, row in _TABLE.items() if row[0] == status_code), None)
        if kind is None:
            return cls(status_code, message, code=code,
                       err_type="server_error" if status_code >= 500 else "invalid_request_error")
        _, err_type, default_code, _ = _TABLE[kind]
        return cls(status_code, message, err_type=err_type, code=code or default_code)


def error_body(exc: BaseException) -> dict[str, Any]:
    """The in-band error event of a stream that already started."""
    if isinstance(exc, OpenAIError):
        return exc.body()
    if isinstance(exc, SluiceError):
        return OpenAIError.of(exc).body()
    return OpenAIError(500, "internal error while streaming", err_type="server_error").body()
