"""The SSE relay's contract, on the real relay code served by real uvicorn."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from engines.base import EngineError
from engines.errors import ErrorKind
from gateway.openai.streaming import sse
from tests.servers import free_port

pytestmark = pytest.mark.integration  # real uvicorn


@pytest.fixture(scope="module")
def relay_url() -> Iterator[str]:
    app = FastAPI()

    async def fails_after_first() -> AsyncIterator[dict]:
        yield {"n": 1}
        raise EngineError("worker died mid-stream", ErrorKind.INTERNAL)

    async def slow() -> AsyncIterator[dict]:
        await asyncio.sleep(0.5)
        yield {"n": 1}

    @app.get("/fail")
    async def fail():  # type: ignore[no-untyped-def]
        return sse(fails_after_first(), ping_s=5, headers={})

    async def chunk_then_fail() -> AsyncIterator[dict]:
        yield {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": None}]}
        raise EngineError("worker died mid-stream", ErrorKind.INTERNAL)

    @app.post("/v1/chat/completions")
    async def chat():  # type: ignore[no-untyped-def]
        return sse(chunk_then_fail(), ping_s=5, headers={})

    @app.get("/slow")
    async def slow_route():  # type: ignore[no-untyped-def]
        return sse(slow(), ping_s=0.1, headers={})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(100):
        if server.started:
            break
        threading.Event().wait(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def _events(url: str) -> list[str]:
    with httpx.stream("GET", url, timeout=10) as r:
        return [line for line in r.iter_lines() if line]


def test_error_after_first_byte_is_an_error_event_then_done(relay_url: str) -> None:
    lines = _events(relay_url + "/fail")
    data = [line[6:] for line in lines if line.startswith("data: ")]
    assert json.loads(data[0]) == {"n": 1}
    err = json.loads(data[1])["error"]
    assert err["message"] == "worker died mid-stream" and err["type"] == "server_error"
    assert data[2] == "[DONE]" and len(data) == 3


def test_pings_while_waiting(relay_url: str) -> None:
    lines = _events(relay_url + "/slow")
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    assert any(line.startswith(": ping") for line in lines[:first_data])


def test_sdk_raises_on_an_error_event_after_the_first_chunk(relay_url: str) -> None:
    import openai

    sdk = openai.OpenAI(base_url=relay_url + "/v1", api_key="unused", max_retries=0)
    stream = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
    got = []
    with pytest.raises(openai.APIError) as e:
        for chunk in stream:
            got.append(chunk.choices[0].delta.content)
    assert got == ["Hel"]
    assert "worker died mid-stream" in str(e.value)
