"""Every example in examples/ runs against a live gateway and prints what it should (the vLLM
tool-call example runs in tests/integration/vllm_pair/test_examples_vllm.py, against vLLM workers)."""

from __future__ import annotations

import json
import re

import pytest

from tests.clients.scripts import run_example
from tests.servers import LLM_NAME, Server

pytestmark = pytest.mark.integration


def env_of(server: Server) -> dict[str, str]:
    return {"SLUICE_URL": server.url, "SLUICE_GRPC_URL": f"127.0.0.1:{server.grpc_port}", "SLUICE_MODEL": LLM_NAME}


def lines(out: str, prefix: str) -> list[str]:
    return [line.removeprefix(prefix) for line in out.splitlines() if line.startswith(prefix)]


def test_openai_sync(ui_server: Server) -> None:
    out = run_example("openai_sync.py", env=env_of(ui_server))
    assert lines(out, "models: ") == [LLM_NAME]
    assert "Paris" in lines(out, "reply: ")[0]  # greedy SmolLM2: "The capital of France is Paris."
    assert lines(out, "worker: ") == ["local"]
    assert re.search(r"^usage: \d+ prompt \+ \d+ completion tokens$", out, re.M)
    assert lines(out, "completion: ")[0].strip()


def test_priority_deadlines(ui_server: Server) -> None:
    out = run_example("priority_deadlines.py", env=env_of(ui_server))
    assert "Paris" in lines(out, "reply: ")[0]
    assert int(lines(out, "predicted ttft ms: ")[0]) >= 0  # the gateway's prediction, sent with a deadline
    assert lines(out, "unknown class: ") == ["400 invalid_priority"]
    metrics = lines(out, "metric: ")
    admitted = [m for m in metrics if m.startswith("sluice_tenant_admitted_total") and 'priority="interactive"' in m]
    assert admitted and float(admitted[0].rsplit(" ", 1)[1]) >= 1
    met = [m for m in metrics if 'outcome="met"' in m or 'outcome="missed"' in m]
    assert sum(float(m.rsplit(" ", 1)[1]) for m in met) >= 1  # the deadline request was counted


def test_anthropic_messages(ui_server: Server) -> None:
    out = run_example("anthropic_messages.py", env=env_of(ui_server))
    prompt = int(lines(out, "prompt tokens: ")[0])
    assert "Paris" in lines(out, "reply: ")[0]
    fresh, cached, output = map(int, re.findall(r"\d+", lines(out, "usage: ")[0]))
    assert fresh + cached == prompt and output > 0
    assert lines(out, "streamed: ")[0].strip() and lines(out, "streamed stop reason: ")[0] in ("end_turn", "max_tokens")


def test_openai_responses(ui_server: Server) -> None:
    out = run_example("openai_responses.py", env=env_of(ui_server))
    assert "Paris" in lines(out, "first: ")[0] and lines(out, "second: ")[0].strip()
    second, first = map(int, re.findall(r"\d+", lines(out, "second turn prompt tokens: ")[0]))
    assert second > first  # the first turn was carried into the second
    assert lines(out, "streamed: ")[0].strip() and lines(out, "stored: ") == ["True"]
    assert "deleted the first response" in out


def test_openai_async(ui_server: Server) -> None:
    out = run_example("openai_async.py", "--url", ui_server.url, env={"SLUICE_MODEL": LLM_NAME})
    replies = [line.split(" -> ", 1) for line in out.splitlines() if re.match(r"reply \d: ", line)]
    assert len(replies) == 3 and all(answer.strip() for _, answer in replies)
    assert "Paris" in replies[0][1]
    assert int(lines(out, "streamed chunks: ")[0]) > 1


def test_openai_stream(ui_server: Server) -> None:
    out = run_example("openai_stream.py", "--max-tokens", "16", env=env_of(ui_server))
    assert int(lines(out, "chunks: ")[0]) > 1
    assert re.search(r"^time to first token: \d+\.\d\d s$", out, re.M)
    # The in-process engine reports no cached tokens; the usage chunk still arrives.
    assert re.search(r"^usage: \d+ prompt \(unreported cached\) \+ 16 completion tokens$", out, re.M)


def test_langchain(ui_server: Server) -> None:
    out = run_example("langchain_chat.py", env=env_of(ui_server))
    assert "Paris" in lines(out, "invoke: ")[0]
    assert re.search(r"^usage: \d+ input \+ \d+ output tokens$", out, re.M)
    assert int(lines(out, "stream chunks: ")[0]) > 1
    assert len(lines(out, "batch: ")) == 2


@pytest.mark.parametrize("name", ["triton_http.py", "triton_grpc.py"])
def test_tritonclient(ui_server: Server, name: str) -> None:
    out = run_example(name, "--count", "16", env=env_of(ui_server))
    assert "server live: True ready: True" in out
    digits = re.findall(r"^digit \d+: true=(\w+) predicted=(\w+) score=([\d.]+)$", out, re.M)
    assert len(digits) == 16 and all(true == predicted for true, predicted, _ in digits)  # training digits
    assert lines(out, "ensemble correct: ") == ["16/16"]
    assert lines(out, "digits_onnx agrees with the ensemble: ") == ["True"]
    if name == "triton_http.py":
        assert lines(out, "digits_ensemble inputs: ") == ["[('IMAGE', 'UINT8', [-1, 8, 8])]"]
        assert int(lines(out, "digits_ensemble inferences: ")[0]) >= 16
    else:
        assert lines(out, "digits_ensemble steps: ") == ["digits_preprocess -> digits_onnx -> digits_postprocess"]
        assert lines(out, "async digit 0: ") == ["zero"]


def test_curl(ui_server: Server) -> None:
    out = run_example("curl.sh", ui_server.url, env={"SLUICE_MODEL": LLM_NAME})
    sections = dict(re.findall(r"^== (.+?)\n(.*?)(?=^== |\Z)", out, re.M | re.S))
    models = json.loads(sections["GET /v1/models"])
    assert [m["id"] for m in models["data"]] == [LLM_NAME]
    chat = json.loads(sections["POST /v1/chat/completions"])
    assert "Paris" in chat["choices"][0]["message"]["content"]
    streamed = next(v for k, v in sections.items() if k.startswith("POST /v1/chat/completions, streamed"))
    events = [line[6:] for line in streamed.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["usage"]["completion_tokens"] == 8
    chunks = [json.loads(e) for e in events[:-1]]
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) > 1
    infer = json.loads(sections["POST /v2/models/digits_ensemble/infer"])
    outputs = {o["name"]: o["data"] for o in infer["outputs"]}
    assert outputs["LABEL"] == ["zero"] and outputs["SCORE"][0] > 0.5
