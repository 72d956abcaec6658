"""The outermost middleware, on the real middleware and error handlers served by real uvicorn:
an exception that escapes a route before the response starts is a 500 in the route's own
protocol, logged and counted as 500 (not a dropped connection, not a 413)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request

from gateway.http import error_handlers as errors
from gateway.http.middleware import BodyLimitMiddleware, SluiceMiddleware
from tests.servers import free_port

pytestmark = pytest.mark.integration

observed: list[tuple[str, int]] = []


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = FastAPI()
    errors.install(app)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=2048)
    app.add_middleware(SluiceMiddleware, observe=lambda route, model, status: observed.append((route, status)))

    @app.post("/v1/boom")
    async def boom(request: Request) -> dict[str, str]:
        await request.body()
        raise RuntimeError("a bug, with a secret in its message")

    @app.post("/v2/models/m/infer")
    async def kserve_boom() -> dict[str, str]:
        raise KeyError("also a bug")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        threading.Event().wait(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_unhandled_error_before_the_response_is_an_openai_500(url: str, caplog: pytest.LogCaptureFixture) -> None:
    observed.clear()
    with caplog.at_level(logging.ERROR, logger="sluice.access"):
        r = httpx.post(url + "/v1/boom", json={"x": 1})
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["type"] == "server_error" and "secret" not in err["message"]
    assert r.headers["x-request-id"]
    assert observed == [("/v1/boom", 500)]
    assert any("unhandled error" in rec.getMessage() and rec.exc_info for rec in caplog.records)


def test_unhandled_error_on_kserve_is_kserve_shaped(url: str) -> None:
    r = httpx.post(url + "/v2/models/m/infer", json={})
    assert r.status_code == 500 and isinstance(r.json()["error"], str)


def test_body_over_the_limit_is_still_413(url: str) -> None:
    observed.clear()
    r = httpx.post(url + "/v1/boom", content=b"x" * 4096, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert observed == [("unmatched", 413)]  # refused by Content-Length, before routing
