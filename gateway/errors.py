"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`.

Every failure on an OpenAI route goes through `OpenAIError` so the SDKs map it
to the right exception class (400 → BadRequestError, 404 → NotFoundError, ...).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engines.base import EngineError
from engines.errors import ErrorKind, SluiceError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


_KIND_STATUS = {
    ErrorKind.INVALID_ARG: (400, "invalid_request_error"), ErrorKind.CONTEXT_TOO_LONG: (400, "invalid_request_error"),
    ErrorKind.TOO_LARGE: (413, "invalid_request_error"), ErrorKind.UNSUPPORTED: (400, "invalid_request_error"),
    ErrorKind.NOT_FOUND: (404, "invalid_request_error"), ErrorKind.ALREADY_EXISTS: (409, "invalid_request_error"),
    ErrorKind.OVERLOADED: (503, "server_error"), ErrorKind.UNAVAILABLE: (503, "server_error"),
    ErrorKind.NO_WORKER: (503, "server_error"), ErrorKind.MODEL_LOADING: (503, "server_error"),
    ErrorKind.RATE_LIMITED: (429, "rate_limit_error"),
}


class OpenAIError(Exception):
    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        err_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.code = code
        self.param = param
        self.err_type = err_type or _TYPES.get(status_code, "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.code}}

    @classmethod
    def from_engine(cls, e: SluiceError) -> OpenAIError:
        status, err_type = _KIND_STATUS.get(e.kind, (500, "server_error"))
        headers = {"Retry-After": "1"} if status in (429, 503) else None
        return cls(status, e.message, code=e.code, param=e.param, err_type=err_type, headers=headers)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(404, f"The model `{model}` does not exist.", code="model_not_found", param="model")


async def openai_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIError)
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers)


async def engine_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EngineError)
    err = OpenAIError.from_engine(exc)
    return JSONResponse(err.body(), status_code=err.status_code, headers=err.headers)


def _describe(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
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


def _kserve(request: Request) -> bool:
    # KServe v2 routes answer in their own shape: {"error": "..."}.
    return request.url.path.startswith("/v2")


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, param = _describe(list(exc.errors()))
    if _kserve(request):
        return JSONResponse({"error": message}, status_code=400)
    return JSONResponse(OpenAIError(400, message, param=param).body(), status_code=400)


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = getattr(exc, "headers", None)
    if _kserve(request):
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=headers)
    err = OpenAIError(exc.status_code, str(exc.detail))
    return JSONResponse(err.body(), status_code=exc.status_code, headers=headers)
