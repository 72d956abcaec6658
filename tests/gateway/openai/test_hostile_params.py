"""Hostile sampling parameters, on every LLM protocol (OpenAI, KServe generate over HTTP, gRPC):
each gets a 4xx in the protocol's own shape, and afterwards the server still answers a chat
and a classic infer. Two of these once killed the engine for every later request
(`top_k: 3000000000`, `temperature: 1e-300`)."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.servers import LLM_NAME, Server

pytestmark = pytest.mark.integration

MSG = [{"role": "user", "content": "What is the capital of France?"}]
HOSTILE = [
    ({"top_k": 3_000_000_000}, "top_k"),
    ({"top_k": 0}, "top_k"),
    ({"seed": 2**70}, "seed"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 2**40}, "max_tokens"),
    ({"n": 100_000}, "n"),
    ({"temperature": 1e300}, "temperature"),
    ({"top_p": -3}, "top_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_tokens": 50, "max_tokens": 5}, "min_tokens"),
    ({"stop": ["x"] * 17}, "stop"),
    ({"stop": ["y" * 5000]}, "stop"),
    ({"stop_token_ids": [10**9]}, "stop_token_ids"),
    ({"stop_token_ids": list(range(100))}, "stop_token_ids"),
    ({"logit_bias": {"1": 500}}, "logit_bias"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {str(i): 1 for i in range(400)}}, "logit_bias"),
]


def _survives(server: Server) -> None:
    """The engine still answers, and answers right: one greedy token (" Paris"), the cheapest proof
    that a refused request left neither a dead engine nor a corrupted one behind."""
    r = httpx.post(server.url + "/v1/completions", timeout=120,
                   json={"model": LLM_NAME, "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"].strip() == "Paris", r.text
    pixels = np.zeros((1, 64), dtype=np.float32)
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    inp = httpclient.InferInput("input", list(pixels.shape), "FP32")
    inp.set_data_from_numpy(pixels)
    assert client.infer("digits_onnx", [inp]).as_numpy("label").shape == (1, 1)
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.parametrize(("bad", "param"), HOSTILE, ids=[p for _, p in HOSTILE])
def test_openai_refuses_and_survives(full_server: Server, bad: dict, param: str) -> None:
    r = httpx.post(full_server.url + "/v1/chat/completions", json={"model": LLM_NAME, "messages": MSG, **bad})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    _survives(full_server)


# KServe generate has no `n` and no `logit_bias`: every other bound applies there too.
KSERVE_HOSTILE = [(bad, param) for bad, param in HOSTILE if param not in ("n", "logit_bias")]


@pytest.mark.parametrize(("bad", "param"), KSERVE_HOSTILE, ids=[p for _, p in KSERVE_HOSTILE])
def test_kserve_generate_refuses_and_survives(full_server: Server, bad: dict, param: str) -> None:
    r = httpx.post(f"{full_server.url}/v2/models/{LLM_NAME}/generate",
                   json={"text_input": "Hello", "parameters": bad})
    assert r.status_code == 400, r.text
    assert param in r.json()["error"]
    _survives(full_server)


def test_grpc_parameters_are_checked_the_same_way(full_server: Server) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{full_server.grpc_port}")
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"Hello"], dtype=object))
    try:
        for bad in ({"top_k": 3_000_000_000}, {"max_tokens": -5}, {"temperature": "hot"}):
            with pytest.raises(InferenceServerException) as err:
                client.infer(LLM_NAME, [inp], parameters=bad)
            assert err.value.status() == "StatusCode.INVALID_ARGUMENT", bad
    finally:
        client.close()
    _survives(full_server)


def test_underflowing_temperature_is_greedy(full_server: Server) -> None:
    greedy = httpx.post(full_server.url + "/v1/completions", timeout=120, json={
        "model": LLM_NAME, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}).json()
    tiny = httpx.post(full_server.url + "/v1/completions", timeout=120, json={
        "model": LLM_NAME, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 1e-300})
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["text"] == greedy["choices"][0]["text"]
    _survives(full_server)


def test_nan_and_fan_out_are_refused(full_server: Server) -> None:
    nan = httpx.post(full_server.url + "/v1/chat/completions", headers={"content-type": "application/json"},
                     content=b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}'
                     % LLM_NAME.encode())
    assert nan.status_code == 400 and nan.json()["error"]["param"] == "temperature"
    wide = httpx.post(full_server.url + "/v1/completions",
                      json={"model": LLM_NAME, "prompt": ["a"] * 200, "n": 2, "max_tokens": 1})
    assert wide.status_code == 400 and "at most 128" in wide.json()["error"]["message"]
    _survives(full_server)


def test_kserve_generate_with_a_non_object_body_is_400(full_server: Server) -> None:
    r = httpx.post(f"{full_server.url}/v2/models/{LLM_NAME}/generate", content=json.dumps([1, 2]).encode(),
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    _survives(full_server)
