"""Normalise the error shapes of OpenAI-compatible engines into EngineError (pure).

Shapes seen in the wild:
- vLLM (current): ``{"error": {"message", "type", "param", "code"}}``, HTTP status set.
- vLLM (older) and trtllm-serve: flat ``{"object": "error", "message", "type", "param",
  "code"}``, where ``code`` is the HTTP status as an int and ``type`` is a Python-ish
  class name such as ``"BadRequestError"``.
- anything else (a proxy's HTML 502, a crashed worker): not JSON at all.

The result carries a domain `ErrorKind` read from the worker's status, a string
``code`` or None, and ``retryable`` set for failures another worker might not
have (5xx, 429).
"""

from __future__ import annotations

import json
from typing import Any

from engines.base import EngineError
from engines.errors import ErrorKind

# How a worker's HTTP status reads as a domain error (the inverse of an edge's table).
_STATUS_KINDS = {400: ErrorKind.INVALID_ARG, 401: ErrorKind.UNAUTHENTICATED, 403: ErrorKind.PERMISSION_DENIED,
                 404: ErrorKind.NOT_FOUND, 409: ErrorKind.ALREADY_EXISTS, 413: ErrorKind.TOO_LARGE,
                 422: ErrorKind.INVALID_ARG, 429: ErrorKind.OVERLOADED, 501: ErrorKind.UNSUPPORTED,
                 502: ErrorKind.UNAVAILABLE, 503: ErrorKind.UNAVAILABLE, 504: ErrorKind.UNAVAILABLE}
_MAX_MESSAGE_CHARS = 500  # a worker's HTML error page must not flood the client


def _kind(status_code: int, code: str | None) -> ErrorKind:
    if code == "context_length_exceeded":
        return ErrorKind.CONTEXT_TOO_LONG
    return _STATUS_KINDS.get(status_code, ErrorKind.INTERNAL if status_code >= 500 else ErrorKind.INVALID_ARG)


def _code(raw_code: Any, message: str) -> str | None:
    """OpenAI codes are strings; engines often put the HTTP status there instead."""
    if isinstance(raw_code, str) and raw_code and not raw_code.isdigit():
        return raw_code
    lowered = message.lower()
    if "maximum context length" in lowered or ("context length" in lowered and "exceed" in lowered):
        return "context_length_exceeded"
    if "does not exist" in lowered and "model" in lowered:
        return "model_not_found"
    return None


def error_fields(payload: Any) -> dict[str, Any] | None:
    """The error object inside a decoded JSON body, or None if it is not an error."""
    if not isinstance(payload, dict):
        return None
    inner = payload.get("error")
    if isinstance(inner, dict):
        return inner
    if isinstance(inner, str):  # e.g. {"error": "Not found"}
        return {"message": inner}
    if payload.get("object") == "error" or ("message" in payload and "type" in payload):
        return payload
    return None


def normalize_error(status_code: int, body: bytes | str | None) -> EngineError:
    """Build an EngineError from a worker's non-2xx response."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    try:
        fields = error_fields(json.loads(text)) if text else None
    except ValueError:
        fields = None
    if fields is None:
        message = text.strip()[:_MAX_MESSAGE_CHARS] or f"worker returned HTTP {status_code}"
        fields = {"message": message}
    message = str(fields.get("message") or f"worker returned HTTP {status_code}")
    # An engine may put the real status in `code` while answering 200 on a stream.
    raw_code = fields.get("code")
    if status_code < 400 and isinstance(raw_code, int) and raw_code >= 400:
        status_code = raw_code
    status_code = status_code if status_code >= 400 else 500
    code = _code(raw_code, message)
    return EngineError(
        message,
        _kind(status_code, code),
        code=code,
        param=fields.get("param") if isinstance(fields.get("param"), str) else None,
        retryable=status_code >= 500 or status_code == 429,
    )


def stream_error(chunk: dict[str, Any]) -> EngineError | None:
    """An error event inside an SSE stream (``data: {"error": ...}``), or None."""
    fields = error_fields(chunk)
    if fields is None or "choices" in chunk:
        return None
    return normalize_error(200, json.dumps({"error": fields}))


def refusal(name: str, status: int, body: bytes) -> EngineError:
    """A worker's non-200 answer. A 401 or 403 refuses the gateway's worker key (clients' keys stop
    at the gateway), so it is named as that, a 503 another worker may not give, never the client's 401."""
    if status in (401, 403):
        return EngineError(f"worker {name} refused the gateway's worker key (HTTP {status}): give the gateway "
                           "the workers' key (--worker-key-file, SLUICE_WORKER_KEY)", ErrorKind.UNAVAILABLE,
                           code="worker_key_refused", retryable=True)
    return normalize_error(status, body)
