"""The pure-ASGI KServe infer route, called in process: what it answers besides an inference.

It is the only infer route (FastAPI's router has none), so it answers what the router would
for a route of its own: 405 with `Allow: POST` for another method, a redirect for a trailing
slash. Errors are `ErrorReply`'s, the same bytes FastAPI's JSONResponse renders. Inferences
themselves are exercised on a real server in tests/integration/test_kserve_http.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.responses import JSONResponse

from engines.classic.errors import InferError
from engines.classic.manager import ModelRepositoryManager
from engines.errors import ErrorKind, SluiceError
from gateway.kserve.errors import ErrorReply
from gateway.kserve.infer_http import KServeInferRoute
from gateway.llm.registry import LLMModel


class NoLLMs:
    """The LLM side of a gateway that serves none."""

    pending: frozenset[str] = frozenset()

    def has(self, name: str) -> bool:
        return False

    def names(self) -> list[str]:
        return []

    def get(self, name: str) -> LLMModel:
        raise SluiceError(f"no LLM {name}", ErrorKind.NOT_FOUND)


async def _call(route: KServeInferRoute, method: str, path: str, body: bytes = b""
                ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    scope: dict[str, Any] = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
                             "query_string": b"", "headers": [(b"host", b"testserver")], "scheme": "http",
                             "server": ("testserver", 80), "root_path": ""}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await route(scope, receive, send)
    return scope, sent


@pytest.fixture
def route(tmp_path: Path) -> KServeInferRoute:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"the app"})

    return KServeInferRoute(app, ModelRepositoryManager(tmp_path), NoLLMs())


VALID_BODY = b'{"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]}]}'


def _headers(start: dict[str, Any]) -> dict[bytes, bytes]:
    return dict(start["headers"])


@pytest.mark.parametrize("method", ["GET", "PUT", "HEAD"])
async def test_another_method_is_405_allow_post_as_fastapi_answers(route: KServeInferRoute, method: str) -> None:
    scope, (start, body) = await _call(route, method, "/v2/models/m/versions/2/infer")
    assert start["status"] == 405 and _headers(start)[b"allow"] == b"POST"
    assert json.loads(body["body"]) == {"error": "Method Not Allowed"}
    assert scope["route"].path == "/v2/models/{name}/versions/{version}/infer"  # for the access log and metrics


async def test_a_trailing_slash_is_redirected_to_the_route(route: KServeInferRoute) -> None:
    scope, (start, _) = await _call(route, "POST", "/v2/models/m/infer/")
    assert start["status"] == 307
    assert _headers(start)[b"location"] == b"http://testserver/v2/models/m/infer"
    assert "route" not in scope


async def test_other_paths_go_on_to_the_app(route: KServeInferRoute) -> None:
    _, (start, body) = await _call(route, "POST", "/v2/models/m/generate")
    assert start["status"] == 299 and body["body"] == b"the app"


async def test_the_body_is_decoded_before_the_model_is_looked_up(route: KServeInferRoute) -> None:
    _, (start, body) = await _call(route, "POST", "/v2/models/nope/infer", b"not json")
    assert start["status"] == 400 and "JSON" in json.loads(body["body"])["error"]
    _, (start, body) = await _call(route, "POST", "/v2/models/nope/infer", VALID_BODY)
    assert start["status"] == 404 and "nope" in json.loads(body["body"])["error"]
    assert _headers(start)[b"content-length"] == str(len(body["body"])).encode()


def test_an_error_reply_is_the_bytes_fastapi_renders_with_retry_after_on_503() -> None:
    reply = ErrorReply.of(InferError("queue full: \u00e9\n", ErrorKind.OVERLOADED))
    rendered = JSONResponse(reply.body(), status_code=reply.status, headers=reply.headers)
    assert (reply.status, reply.headers) == (503, {"Retry-After": "1"})
    assert reply.body_bytes() == rendered.body
    assert (b"retry-after", b"1") in reply.raw_headers()
    late = SluiceError("slow down", ErrorKind.RATE_LIMITED, retry_after_s=7.4)
    assert ErrorReply.of(late).headers == {"Retry-After": "7"}
    assert ErrorReply.of(InferError("bad")).headers == {}
