"""One request id and one trace from the client through the gateway to the worker, and both in
every log line, with real servers: a gateway and a `sluice worker --engine transformers` behind it
(itself a Sluice gateway, so it continues a traceparent and logs the X-Request-Id it is sent), both
exporting spans to a real OTLP receiver and logging JSON.

Checked: a client's traceparent is continued (the gateway's `llm.request` is a child of the client's
span, the worker's a child of the gateway's `llm.engine`), its tracestate reaches the worker; the
client's X-Request-Id comes back on every response (streamed, refused) and reaches the worker; both
ids are in the log records of both; a malformed X-Request-Id or traceparent is ignored, never echoed;
the latency histograms carry the trace as an exemplar in an OpenMetrics scrape, on both metrics ports.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.servers import LLM_NAME, ROOT, Server, free_port, start_server, wait_healthy

pytestmark = pytest.mark.integration

FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
TRACE_ID, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


@dataclass
class Stack:
    receiver: OtlpReceiver
    gateway: Server
    worker: Server
    metrics_port: int


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("trace-context")
    (tmp / "repo").mkdir()
    with OtlpReceiver() as receiver:
        metrics_port = free_port()
        gateway = start_server(["--model-repository", str(tmp / "repo"), "--otlp-endpoint", receiver.url,
                                "--log-format", "json", "--metrics-port", str(metrics_port)],
                               tmp / "gateway.log", env=FAST_EXPORT)
        port = free_port()
        log = (tmp / "worker.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "worker", "--engine", "transformers", "--model", LLM_NAME,
             "--host", "127.0.0.1", "--port", str(port), "--gateway", gateway.url, "--name", "tf-traced"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **FAST_EXPORT, "PYTHONUNBUFFERED": "1", "OTEL_SERVICE_NAME": "sluice-worker",
                 "SLUICE_OTLP_ENDPOINT": receiver.url, "SLUICE_LOG_FORMAT": "json"})
        worker = Server(proc, port, 0, tmp / "worker.log")
        try:
            wait_healthy(worker, 240)
            for _ in range(300):  # registration follows readiness
                if httpx.get(gateway.url + "/v1/models").json()["data"]:
                    break
                time.sleep(0.2)
            yield Stack(receiver, gateway, worker, metrics_port)
        finally:
            worker.stop()
            gateway.stop()


def _records(server: Server, request_id: str) -> list[dict[str, Any]]:
    out = []
    for line in server.log().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("request_id") == request_id:
                out.append(record)
    return out


def _spans(stack: Stack, service: str, request_id: str) -> list[ReceivedSpan]:
    """The spans of the trace whose `service` root span names `request_id`, once it has an engine span."""
    def trace(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        roots = [s for s in spans if s.service == service and s.name == "llm.request"
                 and s.attributes.get("sluice.request_id") == request_id]
        return [s for s in spans if roots and s.trace_id == roots[0].trace_id and s.service == service]

    return trace(stack.receiver.wait_for(lambda spans: any(s.name == "llm.engine" for s in trace(spans))))


def test_a_callers_trace_and_request_id_run_through_gateway_worker_and_logs(stack: Stack) -> None:
    rid = "client-req.42:a_b"
    sdk = openai.OpenAI(base_url=stack.gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    raw = sdk.chat.completions.with_raw_response.create(
        model=LLM_NAME, max_tokens=4, messages=[{"role": "user", "content": "Hello there"}],
        extra_headers={"X-Request-Id": rid, "traceparent": TRACEPARENT, "tracestate": "vendor=opaque1"})
    assert raw.headers["x-request-id"] == rid
    body_id = raw.parse().id

    ours = {s.name: s for s in _spans(stack, "sluice-gateway", rid)}
    root, engine = ours["llm.request"], ours["llm.engine"]
    assert (root.trace_id, root.parent_span_id) == (TRACE_ID, CALLER_SPAN)  # the caller's trace, continued
    assert root.attributes["gen_ai.response.id"] == body_id
    assert engine.parent_span_id == root.span_id
    # The worker (a Sluice gateway too) was sent the same request id and the gateway's engine span.
    theirs = {s.name: s for s in _spans(stack, "sluice-worker", rid)}
    assert theirs["llm.request"].trace_id == TRACE_ID
    assert theirs["llm.request"].parent_span_id == engine.span_id

    for server in (stack.gateway, stack.worker):
        records = _records(server, rid)
        access = [r for r in records if r["logger"] == "sluice.access"]
        assert len(access) == 1 and access[0]["status"] == 200, records
        assert all(r.get("trace_id") == TRACE_ID for r in records), records


def test_the_request_id_comes_back_on_streams_and_refusals(stack: Stack) -> None:
    with httpx.stream("POST", stack.gateway.url + "/v1/chat/completions", timeout=120,
                      headers={"X-Request-Id": "stream-1"},
                      json={"model": LLM_NAME, "stream": True, "max_tokens": 2,
                            "messages": [{"role": "user", "content": "Hi"}]}) as r:
        assert r.status_code == 200 and r.headers["x-request-id"] == "stream-1"
        assert "[DONE]" in "".join(r.iter_text())
    r = httpx.post(stack.gateway.url + "/v1/chat/completions", headers={"X-Request-Id": "refused-1"},
                   json={"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 404 and r.headers["x-request-id"] == "refused-1"


@pytest.mark.parametrize("bad_id, bad_parent", [
    ("has spaces in it", "00-" + "0" * 32 + f"-{CALLER_SPAN}-01"),  # all-zero trace id
    ("x" * 129, f"00-{TRACE_ID}-{CALLER_SPAN}-01-extra"),  # too long; version 00 with a fifth field
    ("semi;colon", f"ff-{TRACE_ID}-{CALLER_SPAN}-01"),  # version ff is forbidden
    ("ok-id-but-parent-upper", f"00-{TRACE_ID.upper()}-{CALLER_SPAN}-01"),
    ("ok-id-but-parent-huge", f"01-{TRACE_ID}-{CALLER_SPAN}-01-" + "a" * 600),  # a later version, oversized
])
def test_malformed_ids_and_traceparents_are_ignored_not_echoed(stack: Stack, bad_id: str, bad_parent: str) -> None:
    r = httpx.post(stack.gateway.url + "/v1/completions", timeout=120,
                   headers={"X-Request-Id": bad_id, "traceparent": bad_parent},
                   json={"model": LLM_NAME, "prompt": "Once", "max_tokens": 2})
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    if bad_id.startswith("ok-id"):
        assert rid == bad_id
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", rid) and bad_id not in r.text
    root = next(s for s in _spans(stack, "sluice-gateway", rid) if s.name == "llm.request")
    assert root.parent_span_id == "" and root.trace_id != TRACE_ID  # a trace of its own
    assert bad_parent not in stack.gateway.log() and (bad_id.startswith("ok-id") or bad_id not in stack.gateway.log())


OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"  # Prometheus's


def test_latency_histograms_carry_the_trace_as_an_exemplar_in_openmetrics(stack: Stack) -> None:
    trace_id = "5" * 32
    r = httpx.post(stack.gateway.url + "/v1/completions", timeout=120,
                   headers={"traceparent": f"00-{trace_id}-{CALLER_SPAN}-01"},
                   json={"model": LLM_NAME, "prompt": "Exemplar", "max_tokens": 2})
    assert r.status_code == 200, r.text
    for url in (stack.gateway.url, f"http://127.0.0.1:{stack.metrics_port}"):
        scrape = httpx.get(url + "/metrics", headers={"Accept": OPENMETRICS})
        assert scrape.headers["content-type"].startswith("application/openmetrics-text")
        families = {f.name: f for f in openmetrics_families(scrape.text)}
        for name in ("sluice_time_to_first_token_seconds", "sluice_e2e_request_latency_seconds",
                     "sluice_queue_time_seconds"):
            exemplars = [s.exemplar.labels for s in families[name].samples if s.exemplar is not None]
            assert {"trace_id": trace_id} in exemplars, (name, exemplars)
        plain = httpx.get(url + "/metrics")  # no Accept: Prometheus text, which has no exemplars
        assert plain.headers["content-type"].startswith("text/plain") and trace_id not in plain.text
