"""Client-sized work runs off the event loop (issue 20, item 4), on a real gateway under uvicorn.

While a multi-MB prompt is tokenized (or a multi-MB JSON body decoded), /health keeps answering:
each test probes /health one request after another for as long as the big request is in flight
and compares, side by side, the slowest probe with the big request itself. With the work on the
event loop the slowest probe waits for all of it (about the whole request); off the loop it waits
a small fraction. Past `--max-prompt-chars` the text is refused in each protocol's own format,
and a pool whose one thread is busy answers 503 with Retry-After rather than queueing without end.
Also item 11a: token ids out of range are a 400 naming the parameter, not a 500.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.servers import DEFAULT_REPO, LLM_NAME, Server, llm_only_repository, start_server

pytestmark = [pytest.mark.integration]

EMBEDDER = "all-minilm-l6-v2"
LIMIT = 7 * 1024 * 1024  # --max-prompt-chars: 7,340,032
BIG = ("The quick brown fox jumps over the lazy dog. " * 200_000)[:7_000_000]  # ~1.5 M tokens, under LIMIT
TOO_BIG = "x" * (LIMIT + 1)  # over LIMIT, under the 8 MiB body limit


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default LLM and the embedding model; one render and one bulk thread that a start waits 0.5 s for."""
    tmp = tmp_path_factory.mktemp("offloop")
    repo = llm_only_repository(tmp)
    shutil.copytree(DEFAULT_REPO / EMBEDDER, repo / EMBEDDER)
    srv = start_server(["--model-repository", str(repo), "--max-prompt-chars", str(LIMIT),
                        "--template-timeout-s", "0.5"], tmp / "server.log", grpc=True,
                       env={"SLUICE_TEMPLATE_THREADS": "1", "SLUICE_BULK_THREADS": "1"})
    yield srv
    srv.stop()


@dataclass
class Probed:
    result: Any
    duration_s: float  # of the big request
    end: float  # when it was answered
    probes: list[tuple[float, float]]  # (sent, answered) of each /health probe, on the same clock

    def check_loop_stayed_free(self) -> None:
        in_flight = [(sent, got) for sent, got in self.probes if got < self.end]
        assert len(in_flight) >= 3, f"only {len(in_flight)} /health probes answered during the big request"
        slowest = max(got - sent for sent, got in self.probes)
        # Side by side: on the loop, one probe waits for (nearly) the whole big request.
        assert slowest < self.duration_s / 2, (slowest, self.duration_s)


def _while_probing(server: Server, big: Callable[[], Any]) -> Probed:
    """`big()` in a thread; /health probed one after another until it returns."""
    out: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        t0 = time.monotonic()
        try:
            out["result"] = big()
        except BaseException as e:  # the assertion below reports it
            out["result"] = e
        out["end"] = time.monotonic()
        out["duration"] = out["end"] - t0
        done.set()

    thread = threading.Thread(target=run)
    probes = []
    with httpx.Client(base_url=server.url, timeout=300) as client:
        thread.start()
        while not done.is_set():
            sent = time.monotonic()
            assert client.get("/health").status_code == 200
            probes.append((sent, time.monotonic()))
    thread.join()
    return Probed(out["result"], out["duration"], out["end"], probes)


def _post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, content=json.dumps(body), timeout=300,
                      headers={"content-type": "application/json"})


BIG_REQUESTS: dict[str, tuple[str, dict[str, Any], int]] = {
    "tokenize": ("/tokenize", {"model": LLM_NAME, "prompt": BIG}, 200),
    "completions": ("/v1/completions", {"model": LLM_NAME, "prompt": BIG, "max_tokens": 1}, 400),
    "embeddings": ("/v1/embeddings", {"model": EMBEDDER, "input": BIG}, 400),
    "kserve-generate": (f"/v2/models/{LLM_NAME}/generate", {"text_input": BIG}, 400),
    # 800,000 one-id prompts: seconds of JSON depth check, parsing and validation, then a fan-out 400.
    "json-body": ("/v1/completions", {"model": LLM_NAME, "prompt": [[i % 1000] for i in range(800_000)]}, 400),
}


@pytest.mark.parametrize("name", list(BIG_REQUESTS))
def test_health_answers_while_a_big_request_is_worked_on(server: Server, name: str) -> None:
    path, body, status = BIG_REQUESTS[name]
    probed = _while_probing(server, lambda: _post(server, path, body))
    r = probed.result
    assert isinstance(r, httpx.Response) and r.status_code == status, r
    if name == "tokenize":
        assert r.json()["count"] > 1_000_000  # it was tokenized, all of it
    elif name != "json-body":  # tokenized, then longer than the model's context
        assert "context" in r.text or "maximum" in r.text, r.text
    probed.check_loop_stayed_free()


def test_health_answers_while_a_grpc_text_input_is_tokenized(server: Server) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([BIG.encode()], dtype=np.object_))

    def big() -> InferenceServerException | None:
        try:
            client.infer(LLM_NAME, [inp], client_timeout=300)
        except InferenceServerException as e:
            return e
        return None

    try:
        probed = _while_probing(server, big)
    finally:
        client.close()
    error = probed.result
    assert isinstance(error, InferenceServerException), error
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "context" in error.message(), error
    probed.check_loop_stayed_free()


def _stub(server: Server) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}",
                                    options=[("grpc.max_send_message_length", 256 * 1024 * 1024)])
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _grpc_text(stub: Any, text: bytes) -> grpc.RpcError:
    request = service_pb2.ModelInferRequest(model_name=LLM_NAME)
    tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(text)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(request, timeout=300)
    return e.value


def test_text_past_the_limit_is_refused_in_each_protocol(server: Server) -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("/tokenize", {"model": LLM_NAME, "prompt": TOO_BIG}, "prompt"),
        ("/v1/completions", {"model": LLM_NAME, "prompt": [TOO_BIG[:LIMIT // 2 + 1]] * 2}, "prompt"),
        ("/v1/chat/completions", {"model": LLM_NAME, "messages": [{"role": "user", "content": TOO_BIG}]}, "messages"),
        ("/v1/embeddings", {"model": EMBEDDER, "input": TOO_BIG}, "input")]
    for path, body, param in cases:
        r = _post(server, path, body)
        assert r.status_code == 400, (path, r.text)
        error = r.json()["error"]
        assert error["param"] == param and str(LIMIT) in error["message"], (path, error)
    r = _post(server, f"/v2/models/{LLM_NAME}/generate", {"text_input": TOO_BIG})
    assert r.status_code == 400 and str(LIMIT) in r.json()["error"], r.text
    channel, stub = _stub(server)
    with channel:
        for text in (TOO_BIG.encode(), b"x" * (4 * LIMIT + 1)):  # decoded off the loop / refused by its size
            e = _grpc_text(stub, text)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and str(LIMIT) in (e.details() or ""), e


def test_a_busy_pool_answers_503_with_retry_after(server: Server) -> None:
    """One pool thread, which a start waits for 0.5 s: of two big tokenizations at once, one is refused."""
    results: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: results.append(
        _post(server, "/tokenize", {"model": LLM_NAME, "prompt": BIG}))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in results) == [200, 503], [r.text[:200] for r in results]
    busy = next(r for r in results if r.status_code == 503)
    assert busy.headers["retry-after"] == "1" and busy.json()["error"]["code"] == "server_busy"


# Item 11a: token ids out of range.

@pytest.fixture(scope="module")
def sdk(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _body(error: openai.APIStatusError) -> dict[str, Any]:
    assert isinstance(error.body, dict), error
    return error.body


@pytest.mark.parametrize("bad", [-1, 2**32, 2**40, 30522])  # 30,522: the embedder's vocabulary size
def test_embedding_ids_out_of_range_are_400(sdk: openai.OpenAI, bad: int) -> None:
    for value in ([101, bad, 102], [[101, 7592, 102], [101, bad, 102]]):
        with pytest.raises(openai.BadRequestError) as e:
            sdk.embeddings.create(model=EMBEDDER, input=value, encoding_format="float")
        body = _body(e.value)
        assert body["param"] == "input" and str(bad) in body["message"], body
    assert len(sdk.embeddings.create(model=EMBEDDER, input=[101, 7592, 102], encoding_format="float").data) == 1


@pytest.mark.parametrize("bad", [-1, 2**32, 2**40])
def test_completion_and_detokenize_ids_out_of_range_are_400(server: Server, sdk: openai.OpenAI, bad: int) -> None:
    for prompt in ([1, bad], [[1, 2], [1, bad]]):
        with pytest.raises(openai.BadRequestError) as e:
            sdk.completions.create(model=LLM_NAME, prompt=prompt, max_tokens=1)
        body = _body(e.value)
        assert body["param"] == "prompt" and str(bad) in body["message"], body
    r = _post(server, "/detokenize", {"model": LLM_NAME, "tokens": [1, bad]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens", r.text
