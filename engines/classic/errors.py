"""Errors of the classic path, classified the way Triton classifies them.

Each error carries a kind (Triton's status codes are a subset); the protocol
edges map it to an HTTP status or a gRPC status code.
"""

from __future__ import annotations

from engines.errors import ErrorKind, SluiceError


class InferError(SluiceError):
    """A request (or a repository call) failed; `message` is safe to return to the client."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.INVALID_ARG) -> None:
        super().__init__(message, kind)


class ConfigError(ValueError):
    """A config.pbtxt (or an override config) is invalid; the message names file and field."""


def invalid(message: str) -> InferError:
    return InferError(message, ErrorKind.INVALID_ARG)


def unavailable(message: str) -> InferError:
    return InferError(message, ErrorKind.UNAVAILABLE)


def not_found(message: str) -> InferError:
    return InferError(message, ErrorKind.NOT_FOUND)
