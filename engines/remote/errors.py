"""Normalise the error shapes of OpenAI-compatible engines into EngineError (pure).

Shapes seen in the wild:
- vLLM (current): ``{"error": {"message", "type", "param", "code"}}``, HTTP status set.
- vLLM (older) and trtllm-serve: flat ``{"object": "error", "message", "type", "param",
  "code"}``, where ``code`` is the HTTP status as an int and ``type`` is a Python-ish
  class name such as ``"BadRequestError"``.
- anything else (a proxy's HTML 502, a crashed worker): not JSON at all.

The result always carries an OpenAI ``type`` (``invalid_request_error``,
``not_found_error``, ``server_error``...), a string ``code`` or None, and
``retryable`` set for failures another worker might not have (5xx, 429).
"""

from __future__ import annotations

import json
from typing import Any

from engines.base import EngineError

# Error types engines use, mapped to OpenAI's vocabulary.
_TYPE_ALIASES = {
    "badrequesterror": "invalid_request_error",
    "bad_request_error": "invalid_request_error",
    "notfounderror": "not_found_error",
    "internalservererror": "server_error",
    "internal_server_error": "server_error",
}
_STATUS_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 413: "invalid_request_error", 422: "invalid_request_error",
                 429: "rate_limit_error"}
_MAX_MESSAGE_CHARS = 500  # a worker's HTML error page must not flood the client


def _openai_type(raw_type: Any, status_code: int) -> str:
    if isinstance(raw_type, str) and raw_type:
        alias = _TYPE_ALIASES.get(raw_type.lower())
        if alias:
            return alias
        if raw_type.endswith("_error"):
            return raw_type
    return _STATUS_TYPES.get(status_code, "server_error" if status_code >= 500 else "invalid_request_error")


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
    return EngineError(
        message,
        status_code=status_code,
        code=_code(raw_code, message),
        err_type=_openai_type(fields.get("type"), status_code),
        param=fields.get("param") if isinstance(fields.get("param"), str) else None,
        retryable=status_code >= 500 or status_code == 429,
    )


def stream_error(chunk: dict[str, Any]) -> EngineError | None:
    """An error event inside an SSE stream (``data: {"error": ...}``), or None."""
    fields = error_fields(chunk)
    if fields is None or "choices" in chunk:
        return None
    return normalize_error(200, json.dumps({"error": fields}))
