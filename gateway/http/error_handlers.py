"""Exception handlers: every failure answered in the protocol of the route it hit.

KServe v2 routes (`/v2...`) answer `{"error": "..."}` through the KServe table (`ErrorReply`);
Anthropic's Messages routes (`/v1/messages...`) answer `{"type": "error", "error": {...}}`;
everything else answers OpenAI's error object through the OpenAI table. Each table lives
with its protocol (`gateway/kserve/errors.py`, `gateway/anthropic/errors.py`,
`gateway/openai/errors.py`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engines.errors import ErrorKind, SluiceError
from gateway.anthropic import errors as anthropic
from gateway.kserve.errors import ErrorReply
from gateway.openai.errors import OpenAIError

log = logging.getLogger("sluice.errors")


def is_kserve(path: str) -> bool:
    return path == "/v2" or path.startswith("/v2/")


def error_json(path: str, exc: SluiceError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) for a domain error on the route at `path`."""
    if is_kserve(path):
        reply = ErrorReply.of(exc)
        return reply.status, reply.body(), reply.headers
    if anthropic.is_anthropic(path):
        return anthropic.of(exc)
    err = OpenAIError.of(exc)
    return err.status_code, err.body(), err.headers


def error_bytes(path: str, exc: SluiceError) -> tuple[int, bytes, dict[str, str]]:
    status, body, headers = error_json(path, exc)
    return status, json.dumps(body).encode(), headers


def status_error_bytes(path: str, status: int, message: str, code: str | None = None) -> bytes:
    """The JSON error body of a bare HTTP status (the protocol layer's 431) on the route at `path`."""
    if is_kserve(path):
        return ErrorReply(status, message).body_bytes()
    if anthropic.is_anthropic(path):
        return json.dumps(anthropic.of_status(status, message)).encode()
    return json.dumps(OpenAIError.of_status(status, message, code=code).body()).encode()


def respond(request: Request, exc: SluiceError) -> JSONResponse:
    status, body, headers = error_json(request.url.path, exc)
    return JSONResponse(body, status_code=status, headers=headers)


async def _domain(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SluiceError)
    return respond(request, exc)


def _describe(errors: list[Any]) -> tuple[str, str | None]:
    unknown = next((e for e in errors if e.get("type") == "extra_forbidden"), None)
    if unknown is not None:  # OpenAI's words for a field it does not know
        name = ".".join(str(p) for p in unknown.get("loc", ()) if p != "body")[:128]  # a client's name: bounded
        return f"Unrecognized request argument supplied: {name}", name
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return "The request body is not valid JSON: " + str(first.get("ctx", {}).get("error", "")), None
    if tuple(first.get("loc", ())) == ("body",) and first.get("type") in ("model_attributes_type", "dict_type",
                                                                        "missing"):
        return "The request body must be a JSON object sent with Content-Type: application/json.", None
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    return (f"Invalid value for '{param}': {msg}" if param else msg), param


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, param = _describe(list(exc.errors()))
    return respond(request, SluiceError(message, ErrorKind.INVALID_ARG, param=param))


async def _http(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own refusals (unknown route 404, wrong method 405)."""
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if is_kserve(request.url.path):
        reply = ErrorReply(exc.status_code, str(exc.detail), headers)
        return JSONResponse(reply.body(), status_code=reply.status, headers=reply.headers)
    if anthropic.is_anthropic(request.url.path):
        return JSONResponse(anthropic.of_status(exc.status_code, str(exc.detail)), status_code=exc.status_code,
                            headers=headers)
    err = OpenAIError.of_status(exc.status_code, str(exc.detail))
    return JSONResponse(err.body(), status_code=exc.status_code, headers=headers)


def install(app: FastAPI) -> None:
    app.add_exception_handler(SluiceError, _domain)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
