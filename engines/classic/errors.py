"""Errors of the classic path, classified the way Triton classifies them.

Each error carries a Triton status code; the protocol front ends map it to an
HTTP status (400/404/500/501/503) or a gRPC status code.
"""

from __future__ import annotations

from enum import Enum


class Code(str, Enum):
    INVALID_ARG = "INVALID_ARG"
    NOT_FOUND = "NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL = "INTERNAL"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"


# Triton's HTTP mapping of its status codes.
HTTP_STATUS = {Code.INVALID_ARG: 400, Code.NOT_FOUND: 404, Code.UNAVAILABLE: 503, Code.INTERNAL: 500,
               Code.UNSUPPORTED: 501, Code.ALREADY_EXISTS: 409}


class InferError(Exception):
    """A request (or a repository call) failed; `message` is safe to return to the client."""

    def __init__(self, message: str, code: Code = Code.INVALID_ARG) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    @property
    def status_code(self) -> int:
        """The HTTP status Triton answers for this error (400/404/409/500/501/503)."""
        return HTTP_STATUS.get(self.code, 400)

    def __repr__(self) -> str:
        return f"InferError({self.code.value}: {self.message})"


class ConfigError(ValueError):
    """A config.pbtxt (or an override config) is invalid; the message names file and field."""


def invalid(message: str) -> InferError:
    return InferError(message, Code.INVALID_ARG)


def unavailable(message: str) -> InferError:
    return InferError(message, Code.UNAVAILABLE)


def not_found(message: str) -> InferError:
    return InferError(message, Code.NOT_FOUND)
