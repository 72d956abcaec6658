"""`sluice serve --otlp-endpoint`: one trace per LLM request, exported over OTLP/HTTP to a real
receiver (tests/otlp_receiver.py parses ExportTraceServiceRequest with opentelemetry-proto).

Checked: the spans (llm.request with llm.route, llm.admission and one llm.engine per attempt),
their parent/child links and attributes; a refused request's trace carries the error; and the
W3C traceparent reaches the worker. With vLLM started with --otlp-traces-endpoint, vLLM's own
span joins the gateway's trace as a child of the gateway's llm.engine span. The sim ignores
trace headers, so with the sim only the gateway's side is checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.integration.vllm_support import (
    ROOT,
    free_port_pair,
    stop_process,
    tiny_llama_dir,
    vllm_env,
    wait_healthy,
)
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.servers import Server, start_server

pytestmark = pytest.mark.integration

MODEL = "tiny-llama"
GATEWAY = "sluice-gateway"
CLIENT_KIND = 3  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_CLIENT
ERROR = 2  # Status.STATUS_CODE_ERROR
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # milliseconds between batch exports


@dataclass
class Stack:
    engine: str
    receiver: OtlpReceiver
    gateway: Server
    worker: str


def _launch(engine: str, name: str, port: int, kv_port: int, gateway: str, otlp: str) -> subprocess.Popen[bytes]:
    common = ["--model", str(tiny_llama_dir()), "--served-model-name", MODEL, "--port", str(port),
              "--kv-events-port", str(kv_port), "--gateway", gateway, "--name", name]
    if engine == "vllm":
        env = vllm_env(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf", **FAST_EXPORT)
        argv = [sys.executable, "-m", "engines.launchers", "--engine", "vllm", *common, "--max-model-len", "1024",
                "--", "--otlp-traces-endpoint", otlp]
    else:
        env = dict(os.environ)
        argv = [sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim", *common,
                "--profile", "base_s=0.001,decode_seq_s=0.0005"]
    return subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)


@pytest.fixture(scope="module", params=["sim", pytest.param("vllm", marks=pytest.mark.vllm)])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    engine: str = request.param
    tmp = tmp_path_factory.mktemp(f"tracing-{engine}")
    (tmp / "repo").mkdir()
    with OtlpReceiver() as receiver:
        gateway = start_server(["--model-repository", str(tmp / "repo"), "--otlp-endpoint", receiver.url],
                               tmp / "gateway.log", env=FAST_EXPORT, wait=False)
        name = f"traced-{engine}"
        port, kv_port = free_port_pair(), free_port_pair()
        proc = _launch(engine, name, port, kv_port, gateway.url, receiver.url)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", proc)
            for _ in range(600):  # bounded: registration follows readiness
                if MODEL in _models(gateway):
                    break
                time.sleep(0.1)
            yield Stack(engine, receiver, gateway, name)
        finally:
            stop_process(proc)
            gateway.stop()


def _models(gateway: Server) -> list[str]:
    return [m["id"] for m in httpx.get(gateway.url + "/v1/models", timeout=10).json()["data"]]


def _trace_of(spans: list[ReceivedSpan], request_id: str) -> list[ReceivedSpan]:
    """The trace of the response whose body `id` is `request_id`."""
    roots = [s for s in spans if s.name == "llm.request" and s.attributes.get("gen_ai.response.id") == request_id]
    if not roots:
        return []
    return [s for s in spans if s.trace_id == roots[0].trace_id]


def _wait_trace(stack: Stack, request_id: str, names: set[str]) -> list[ReceivedSpan]:
    def done(spans: list[ReceivedSpan]) -> bool:
        return names <= {s.name for s in _trace_of(spans, request_id) if s.service == GATEWAY}

    return _trace_of(stack.receiver.wait_for(done), request_id)


def test_a_streamed_chat_is_one_trace_with_linked_spans(stack: Stack) -> None:
    with httpx.stream("POST", stack.gateway.url + "/v1/chat/completions", timeout=120, json={
            "model": MODEL, "stream": True, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Trace this request, please."}]}) as r:
        assert r.status_code == 200
        text = "".join(r.iter_text())
    assert "[DONE]" in text
    request_id = json.loads(text.split("data: ", 2)[1].split("\n", 1)[0])["id"]  # the first chunk's
    trace = _wait_trace(stack, request_id, {"llm.request", "llm.route", "llm.admission", "llm.engine"})
    ours = [s for s in trace if s.service == GATEWAY]
    root = next(s for s in ours if s.name == "llm.request")
    assert root.parent_span_id == ""  # the client sent no traceparent: the gateway starts the trace
    assert root.attributes["gen_ai.request.model"] == MODEL and root.attributes["gen_ai.usage.input_tokens"] > 0
    assert root.attributes["sluice.worker"] == stack.worker
    children = {s.name: s for s in ours if s is not root}
    assert set(children) == {"llm.route", "llm.admission", "llm.engine"}
    assert all(s.parent_span_id == root.span_id for s in children.values())
    route, engine = children["llm.route"], children["llm.engine"]
    assert route.attributes["sluice.worker"] == stack.worker and route.attributes["sluice.route.reason"]
    assert engine.kind == CLIENT_KIND and engine.attributes["sluice.worker"] == stack.worker
    assert engine.attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert engine.attributes["gen_ai.usage.output_tokens"] == 8
    assert "first_token" in engine.events
    assert all(s.status_code != ERROR for s in ours)
    if stack.engine == "vllm":
        # The traceparent reached vLLM: its span continues the trace, under the gateway's engine call.
        worker_spans = stack.receiver.wait_for(
            lambda spans: any(s.trace_id == root.trace_id and s.service != GATEWAY for s in spans))
        theirs = [s for s in worker_spans if s.trace_id == root.trace_id and s.service != GATEWAY]
        assert any(s.parent_span_id == engine.span_id for s in theirs), theirs


def test_each_choice_is_its_own_engine_span(stack: Stack) -> None:
    r = httpx.post(stack.gateway.url + "/v1/completions", timeout=120, json={
        "model": MODEL, "prompt": "Two choices", "n": 2, "max_tokens": 4, "temperature": 1.0, "seed": 3})
    assert r.status_code == 200, r.text
    request_id = r.json()["id"]
    _wait_trace(stack, request_id, {"llm.request", "llm.engine"})
    time.sleep(0.5)  # both choices' spans are exported in the same batch or the next
    trace = _trace_of(stack.receiver.spans, request_id)
    root = next(s for s in trace if s.name == "llm.request")
    engines = [s for s in trace if s.name == "llm.engine"]
    assert len(engines) == 2 and {s.parent_span_id for s in engines} == {root.span_id}
    assert len({s.attributes["sluice.engine_request_id"] for s in engines}) == 2
    assert root.attributes["sluice.choices"] == 2


def test_a_refused_request_ends_its_trace_with_the_error(stack: Stack) -> None:
    r = httpx.post(stack.gateway.url + "/v1/completions", timeout=60, headers={"X-Routing-Policy": "no-such-policy"},
                   json={"model": MODEL, "prompt": "refused", "max_tokens": 4})
    assert r.status_code == 400
    # The only request of this module that fails: its trace is the one whose root is an error.
    spans = stack.receiver.wait_for(lambda spans: any(s.name == "llm.request" and s.status_code == ERROR
                                                      for s in spans))
    root = next(s for s in spans if s.name == "llm.request" and s.status_code == ERROR)
    by_name = {s.name: s for s in spans if s.trace_id == root.trace_id}
    assert by_name["llm.route"].status_code == ERROR and by_name["llm.request"].status_code == ERROR
    assert "llm.engine" not in by_name  # it never reached a worker
