"""KServe v2 generate / generate_stream, LLM text over gRPC, errors and views, on the real SmolLM2
(the transformers engine behind the gateway), with real clients."""

from __future__ import annotations

import json
import queue

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.servers import LLM_NAME, Server

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
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{llm_server.grpc_port}")
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"x"], dtype=object))
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer("nope", [inp])
        assert err.value.status() == "StatusCode.NOT_FOUND"
    finally:
        client.close()
