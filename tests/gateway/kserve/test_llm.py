"""KServe v2 generate / generate_stream, LLM text over gRPC, errors and views, on the real SmolLM2
(the transformers engine behind the gateway), with real clients."""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.servers import LLM_NAME, Server, llm_only_repository, metric_value, start_server, wait_healthy

pytestmark = pytest.mark.integration

PROMPT = "The capital of France is"
PARAMS = {"max_tokens": 8, "temperature": 0}


def _openai_text(server: Server) -> str:
    r = httpx.post(server.url + "/v1/completions", timeout=120,
                   json={"model": LLM_NAME, "prompt": PROMPT, **PARAMS})
    return r.json()["choices"][0]["text"]


def test_generate_matches_the_openai_route(llm_server: Server) -> None:
    r = httpx.post(f"{llm_server.url}/v2/models/{LLM_NAME}/generate", timeout=120,
                   json={"text_input": PROMPT, "parameters": PARAMS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model_name"] == LLM_NAME
    assert "Paris" in body["text_output"]
    assert body["text_output"] == _openai_text(llm_server)


def test_generate_stream_concatenates_to_the_same_text(llm_server: Server) -> None:
    pieces = []
    with httpx.stream("POST", f"{llm_server.url}/v2/models/{LLM_NAME}/generate_stream", timeout=120,
                      json={"text_input": PROMPT, "parameters": PARAMS}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                pieces.append(json.loads(line[6:])["text_output"])
    assert len(pieces) > 1 and "".join(pieces) == _openai_text(llm_server)


def test_generate_bad_parameters_are_400(llm_server: Server) -> None:
    r = httpx.post(f"{llm_server.url}/v2/models/{LLM_NAME}/generate",
                   json={"text_input": PROMPT, "parameters": {"max_tokens": -3}})
    assert r.status_code == 400 and "error" in r.json()


def test_grpc_infer_and_stream_on_the_llm(llm_server: Server) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{llm_server.grpc_port}")
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
    try:
        assert client.is_model_ready(LLM_NAME)
        result = client.infer(LLM_NAME, [inp], parameters=PARAMS)
        text = result.as_numpy("text_output")[0].decode()
        assert text == _openai_text(llm_server)
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(LLM_NAME, [inp], request_id="s1", parameters=PARAMS)
        chunks = []
        while True:
            r, e = results.get(timeout=120)
            assert e is None
            chunks.append(r.as_numpy("text_output")[0])
            if r.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
        assert b"".join(chunks).decode() == text
    finally:
        client.close()


def test_generate_stream_ends_with_a_finish_reason(llm_server: Server) -> None:
    events = []
    with httpx.stream("POST", f"{llm_server.url}/v2/models/{LLM_NAME}/generate_stream", timeout=120,
                      json={"text_input": PROMPT, "parameters": {"max_tokens": 3, "temperature": 0}}) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    assert events[-1]["finish_reason"] == "length"
    assert all(e["model_name"] == LLM_NAME for e in events)


def test_generate_errors_and_views(llm_server: Server) -> None:
    base = f"{llm_server.url}/v2"
    r = httpx.post(f"{base}/models/nope/generate", json={"text_input": "x"})
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.post(f"{base}/models/{LLM_NAME}/generate", json={"text_input": "x", "max_tokens": -1})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]
    r = httpx.post(f"{base}/models/{LLM_NAME}/generate_stream", json={"text_input": 5})
    assert r.status_code == 400
    assert httpx.post(f"{base}/models/{LLM_NAME}/infer", json={"inputs": []}).status_code == 400
    assert httpx.get(f"{base}/models/{LLM_NAME}/ready").status_code == 200
    index = httpx.post(f"{base}/repository/index", json={}).json()
    assert any(row["name"] == LLM_NAME and row["state"] == "READY" for row in index)
    # The server still serves after the refusals.
    assert httpx.post(f"{base}/models/{LLM_NAME}/generate", timeout=120,
                      json={"text_input": PROMPT, "parameters": PARAMS}).status_code == 200


def test_grpc_unknown_llm_is_not_found(llm_server: Server) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{llm_server.grpc_port}")
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"x"], dtype=object))
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer("nope", [inp])
        assert err.value.status() == "StatusCode.NOT_FOUND"
    finally:
        client.close()


GATE_MODEL = '''
import os
import time


class TritonPythonModel:
    """Holds the repository's loading until the test creates the gate file."""

    def initialize(self, args):
        while not os.path.exists(os.environ["SLUICE_TEST_GATE"]):
            time.sleep(0.05)

    def execute(self, requests):
        return []
'''


def test_generate_while_the_model_loads_is_503_then_serves(tmp_path: Path) -> None:
    """A model that is still loading is UNAVAILABLE (503), not unknown (404), on KServe HTTP,
    gRPC and OpenAI alike; the load is held on a file gate, not by timing."""
    repo = llm_only_repository(tmp_path)
    (repo / "gate" / "1").mkdir(parents=True)
    (repo / "gate" / "config.pbtxt").write_text('name: "gate"\nbackend: "python"\nmax_batch_size: 0\n'
                                                'input [{ name: "X" data_type: TYPE_FP32 dims: [1] }]\n'
                                                'output [{ name: "Y" data_type: TYPE_FP32 dims: [1] }]\n')
    (repo / "gate" / "1" / "model.py").write_text(GATE_MODEL)
    gate = tmp_path / "open"
    server = start_server(["--model-repository", str(repo)], tmp_path / "gw.log", grpc=True, wait=False,
                          env={"SLUICE_TEST_GATE": str(gate)})
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        r = httpx.post(f"{server.url}/v2/models/{LLM_NAME}/generate", json={"text_input": PROMPT})
        assert r.status_code == 503 and "loading" in r.json()["error"] and r.headers["retry-after"]
        chat = httpx.post(f"{server.url}/v1/chat/completions", json={
            "model": LLM_NAME, "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 503 and chat.json()["error"]["code"] == "model_loading"
        inp = grpcclient.InferInput("text_input", [1], "BYTES")
        inp.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
        with pytest.raises(InferenceServerException) as err:
            client.infer(LLM_NAME, [inp], parameters=PARAMS)
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        assert httpx.get(server.url + "/health").status_code == 503
        gate.touch()
        wait_healthy(server, 240)
        r = httpx.post(f"{server.url}/v2/models/{LLM_NAME}/generate", timeout=120,
                       json={"text_input": PROMPT, "parameters": PARAMS})
        assert r.status_code == 200 and "Paris" in r.json()["text_output"]
        r = httpx.post(f"{server.url}/v2/models/nope/generate", json={"text_input": PROMPT})
        assert r.status_code == 404  # once loaded, an unknown name is unknown
    finally:
        client.close()
        gate.touch()
        server.stop()


def test_grpc_stream_cancel_aborts_the_engine_request(llm_server: Server) -> None:
    """Cancelling ModelStreamInfer (the client leaves) aborts the generation in the engine."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{llm_server.grpc_port}")
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"Write a very long story about the sea."], dtype=object))
    before = _generated(llm_server)
    results: queue.Queue = queue.Queue()
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(LLM_NAME, [inp], request_id="long",
                                  parameters={"max_tokens": 1500, "ignore_eos": True, "temperature": 0})
        for _ in range(3):  # generation is under way
            _, error = results.get(timeout=120)
            assert error is None
        assert _engine_running(llm_server) >= 1
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()
    deadline = time.monotonic() + 120  # only bounds a request that never ends
    while _engine_running(llm_server) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _engine_running(llm_server) == 0
    assert _generated(llm_server) - before < 1500  # stopped early, not run to max_tokens


def _engine_running(server: Server) -> float:
    value = metric_value(httpx.get(server.url + "/metrics").text, "sluice_engine_requests_running",
                         {"model": LLM_NAME})
    assert value is not None
    return value


def _generated(server: Server) -> float:
    text = httpx.get(server.url + "/metrics").text
    return metric_value(text, "sluice_generation_tokens_total", {"model": LLM_NAME}) or 0.0
