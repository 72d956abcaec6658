"""KServe generate / generate_stream (HTTP) and LLM text over gRPC, served by uvicorn + grpc.aio.

The LLM side is a small echo service implementing the LLMServiceProtocol the
gateway injects; these tests are about the protocol layer, not an engine.
"""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import AsyncIterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import uvicorn
from fastapi import FastAPI
from tritonclient.utils import InferenceServerException

from engines.base import Delta, EngineError
from engines.classic import ModelRepositoryManager
from gateway.kserve.grpc import start_grpc_server
from gateway.kserve.http import build_router
from tests.integration.kserve_support import free_port, wait_for

pytestmark = pytest.mark.integration


class EchoLLM:
    def has_model(self, name: str) -> bool:
        return name == "echo"

    def model_names(self) -> list[str]:
        return ["echo"]

    async def generate_text(self, model: str, prompt: str, params: dict) -> AsyncIterator[Delta]:
        if params.get("max_tokens", 1) < 0:
            raise EngineError("max_tokens must be >= 0", status_code=400)
        words = prompt.split()[: params.get("max_tokens", 100)]
        for i, word in enumerate(words):
            yield Delta(text=word + ("" if i == len(words) - 1 else " "))
        yield Delta(finish_reason="stop", completion_tokens=len(words))


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    repo = tmp_path_factory.mktemp("empty_repo")
    http_port, grpc_port = free_port(), free_port()
    manager = ModelRepositoryManager(Path(repo))
    llm = EchoLLM()
    holder: dict = {}

    async def lifespan(app):
        await manager.start()
        holder["grpc"] = await start_grpc_server(manager, llm, "127.0.0.1", grpc_port)
        yield
        await holder["grpc"].stop(grace=1)
        await manager.stop()

    app = FastAPI(lifespan=lifespan)
    app.include_router(build_router(manager, llm))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=http_port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, "uvicorn to start")
    yield f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
    server.should_exit = True
    thread.join(timeout=30)


def test_generate(servers):
    http_url, _ = servers
    r = httpx.post(f"http://{http_url}/v2/models/echo/generate",
                   json={"text_input": "the capital of France", "parameters": {"max_tokens": 3}})
    assert r.status_code == 200
    assert r.json() == {"model_name": "echo", "model_version": "1", "text_output": "the capital of"}


def test_generate_stream(servers):
    http_url, _ = servers
    events = []
    with httpx.stream("POST", f"http://{http_url}/v2/models/echo/generate_stream",
                      json={"text_input": "a b c"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    assert "".join(e["text_output"] for e in events) == "a b c"
    assert events[-1]["finish_reason"] == "stop"


def test_generate_errors(servers):
    http_url, _ = servers
    r = httpx.post(f"http://{http_url}/v2/models/nope/generate", json={"text_input": "x"})
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.post(f"http://{http_url}/v2/models/echo/generate", json={"text_input": "x", "max_tokens": -1})
    assert r.status_code == 400 and r.json() == {"error": "max_tokens must be >= 0"}
    r = httpx.post(f"http://{http_url}/v2/models/echo/generate_stream", json={"text_input": 5})
    assert r.status_code == 400
    assert httpx.post(f"http://{http_url}/v2/models/echo/infer", json={"inputs": []}).status_code == 400
    assert httpx.get(f"http://{http_url}/v2/models/echo/ready").status_code == 200
    index = httpx.post(f"http://{http_url}/v2/repository/index", json={}).json()
    assert {"name": "echo", "version": "1", "state": "READY", "reason": ""} in index


def _text_input(text: str) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([text.encode()], dtype=object))
    return [inp]


def test_grpc_llm_infer_and_stream(servers):
    _, grpc_url = servers
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        result = client.infer("echo", _text_input("one two three"))
        assert result.as_numpy("text_output")[0] == b"one two three"
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer("echo", _text_input("x y"), request_id="s1")
        chunks = []
        while True:
            r, e = results.get(timeout=30)
            assert e is None
            chunks.append(r.as_numpy("text_output")[0])
            if r.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
        assert b"".join(chunks) == b"x y"
        with pytest.raises(InferenceServerException) as err:
            client.infer("nope", _text_input("x"))
        assert err.value.status() == "StatusCode.NOT_FOUND"
    finally:
        client.close()
