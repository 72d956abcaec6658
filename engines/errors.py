"""Domain errors: what went wrong, in no protocol's vocabulary.

Engines, the classic path and the gateway's LLM layer raise `SluiceError` (or a
subclass) carrying an `ErrorKind`. Each protocol edge maps the kind to its own
status with one table: `gateway/openai/errors.py` (OpenAI JSON and HTTP status),
`gateway/kserve/errors.py` (KServe JSON and HTTP status, gRPC status code). No
code below the edges knows an HTTP status.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    # The request is wrong; retrying it unchanged fails again.
    INVALID_ARG = "INVALID_ARG"
    CONTEXT_TOO_LONG = "CONTEXT_TOO_LONG"
    TOO_LARGE = "TOO_LARGE"  # a body, message or tensor over its bound
    UNSUPPORTED = "UNSUPPORTED"  # well-formed, but this server or engine does not do it
    NOT_FOUND = "NOT_FOUND"  # a model, version or worker that does not exist
    ALREADY_EXISTS = "ALREADY_EXISTS"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    # The server cannot serve it now; the same request may succeed later.
    MODEL_LOADING = "MODEL_LOADING"
    OVERLOADED = "OVERLOADED"  # an admission or batcher queue is full
    RATE_LIMITED = "RATE_LIMITED"  # a per-key quota is spent
    DEADLINE = "DEADLINE"  # the request's TTFT deadline cannot be met, or passed while it waited
    NO_WORKER = "NO_WORKER"  # no healthy worker serves the model
    UNAVAILABLE = "UNAVAILABLE"  # a worker, engine or model cannot be reached or is stopped
    CANCELLED = "CANCELLED"  # the client went away
    INTERNAL = "INTERNAL"  # an engine or model failed, or a bug


class SluiceError(Exception):
    """A failure with a kind, a message that is safe to show the client, and hints.

    `code` is a finer machine-readable reason (e.g. "context_length_exceeded",
    "queue_full") that protocol edges may expose; `param` names the offending
    request field. `retryable` tells the dispatcher another worker may succeed
    (used only before the first byte). `retry_after_s` becomes Retry-After.
    """

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.INTERNAL, *, code: str | None = None,
                 param: str | None = None, retryable: bool = False, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.code = code
        self.param = param
        self.retryable = retryable
        self.retry_after_s = retry_after_s

    @property
    def worker_fault(self) -> bool:
        """Whether this counts against the worker that raised it (circuit breaker),
        as opposed to a request the worker rightly refused."""
        return self.retryable or self.kind in (ErrorKind.INTERNAL, ErrorKind.UNAVAILABLE)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind.value}: {self.message})"


def invalid(message: str, param: str | None = None) -> SluiceError:
    return SluiceError(message, ErrorKind.INVALID_ARG, param=param)
