"""The cheap relay (engines.remote.splice, the read interval) against the full one, over real workers.

Two real gateways share a SIM worker and a TensorRT-LLM STAND-IN (tests/standins; not TensorRT-LLM):
`fast` with the defaults (plain events spliced from the worker's bytes, fast streams read every
20 ms) and `full` with `SLUICE_RELAY_SPLICE=false SLUICE_RELAY_INTERVAL_MS=0` (every event decoded,
every read relayed at once: the relay before them). The same seeded request through each must
give the same answer, byte for byte except where the two may differ: the response id, `created`,
and how the tokens are grouped into events (each event's bytes are still exactly orjson's).
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import orjson
import pytest
import yaml

from tests.integration.vllm_support import ROOT, free_port_pair, stop_process, tiny_llama_dir, wait_healthy
from tests.servers import Server, free_port, metric_value, start_server, until

pytestmark = pytest.mark.integration

SIM_MODEL, STANDIN_MODEL = "tiny-llama", "standin-model"
MAX_TOKENS = 24  # every sim answer here: the router's mean answer length is then exactly this
KEY = f"sk-relay-{secrets.token_hex(12)}"
HEADERS = {"Authorization": f"Bearer {KEY}"}


@dataclass
class Relays:
    fast: Server
    full: Server


@pytest.fixture(scope="module")
def relays(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relays]:
    tmp = tmp_path_factory.mktemp("relay")
    (tmp / "repo").mkdir()
    model_dir = tiny_llama_dir()
    sim_port, trt_port = free_port_pair(), free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim", "--model", str(model_dir),
         "--served-model-name", SIM_MODEL, "--port", str(sim_port), "--no-kv-events", "--profile", "base_s=0.005"],
        cwd=ROOT, start_new_session=True)]
    procs.append(subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "standins" / "trtllm_standin.py"), "serve", STANDIN_MODEL,
         "--port", str(trt_port), "--token-delay-s", "0.01"], cwd=ROOT, start_new_session=True))
    servers: list[Server] = []
    try:
        wait_healthy(f"http://127.0.0.1:{sim_port}", procs[0])
        wait_healthy(f"http://127.0.0.1:{trt_port}", procs[1])
        workers = tmp / "workers.yaml"
        workers.write_text(yaml.safe_dump([
            {"name": "sim-0", "url": f"http://127.0.0.1:{sim_port}", "engine": "sim", "models": [SIM_MODEL],
             "tokenizer": str(model_dir)},
            {"name": "trt-0", "url": f"http://127.0.0.1:{trt_port}", "engine": "trtllm", "models": [STANDIN_MODEL],
             "tokenizer": str(model_dir)}]))
        args = ["--model-repository", str(tmp / "repo"), "--workers-file", str(workers)]
        for name, env in (("fast", {}), ("full", {"SLUICE_RELAY_SPLICE": "false", "SLUICE_RELAY_INTERVAL_MS": "0"})):
            servers.append(start_server(args, tmp / f"{name}.log", env={"SLUICE_API_KEYS": KEY, **env}))
        yield Relays(*servers)
    finally:
        for server in servers:
            server.stop()
        for proc in procs:
            stop_process(proc)


def _metrics(server: Server) -> str:
    return httpx.get(server.url + "/metrics", timeout=10).text


def _relay_events(server: Server, worker: str, path: str) -> float:
    return metric_value(_metrics(server), "sluice_relay_events_total", {"worker": worker, "path": path}) or 0.0


def _stream(server: Server, route: str, body: dict[str, Any]) -> list[bytes]:
    """The `data:` payloads of one streamed response, with the gateway's response id and `created` fixed."""
    r = httpx.post(server.url + route, json=body, headers=HEADERS, timeout=60)
    assert r.status_code == 200, r.text
    assert r.content.endswith(b"data: [DONE]\n\n")
    raw = re.sub(rb'"id":"(chatcmpl|cmpl)-[0-9a-f]+","object"', rb'"id":"ID","object"', r.content)
    raw = re.sub(rb'"created":\d+', b'"created":0', raw)
    return [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.startswith(b"data: ")]


def _text_of(choice: dict[str, Any]) -> str | None:
    """The text a plain content event adds, or None for any other event (role, finish, parser output)."""
    if choice.get("finish_reason") is not None or choice.get("logprobs") is not None:
        return None
    delta = choice.get("delta")
    if delta is None:
        return str(choice["text"]) if choice.get("text") else None
    return str(delta["content"]) if set(delta) == {"content"} and delta["content"] else None


def _answer(events: list[bytes]) -> tuple[dict[int, str], dict[int, list[bytes]], list[bytes], set[bytes]]:
    """Per choice: its text, and its other events' bytes; the events with no choice (usage, [DONE]); and
    the shapes of the content events (each with its text blanked)."""
    texts: dict[int, str] = {}
    others: dict[int, list[bytes]] = {}
    rest, shapes = [], set()
    for raw in events:
        event = orjson.loads(raw) if raw != b"[DONE]" else None
        if not event or not event.get("choices"):
            rest.append(raw)
            continue
        (choice,) = event["choices"]
        text = _text_of(choice)
        if text is None:
            others.setdefault(choice["index"], []).append(raw)
            continue
        assert orjson.dumps(event) == raw  # written exactly as orjson writes it: key order, escapes
        texts[choice["index"]] = texts.get(choice["index"], "") + text
        if "delta" in choice:
            choice["delta"]["content"] = ""
        else:
            choice["text"] = ""
        shapes.add(orjson.dumps(event))
    return texts, others, rest, shapes


CASES = {
    "completions": ("/v1/completions", {"prompt": "The sluice gate", "stream_options": {"include_usage": True}}),
    "completions-n2-echo": ("/v1/completions", {"prompt": "Two answers", "n": 2, "echo": True}),
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me about sluices"}],
                                      "stream_options": {"include_usage": True}}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_spliced_stream_is_the_decoded_one(relays: Relays, case: str) -> None:
    route, extra = CASES[case]
    body = {"model": SIM_MODEL, "max_tokens": MAX_TOKENS, "temperature": 0, "seed": 11, "ignore_eos": True,
            "stream": True, **extra}
    spliced_before = _relay_events(relays.fast, "sim-0", "spliced")
    fast, full = _stream(relays.fast, route, body), _stream(relays.full, route, body)
    fast_texts, fast_others, fast_rest, fast_shapes = _answer(fast)
    full_texts, full_others, full_rest, full_shapes = _answer(full)
    assert fast_texts == full_texts and all(full_texts.values())
    assert fast_others == full_others  # the role and finish events, byte for byte
    assert fast_rest == full_rest  # usage (when asked for) and [DONE]
    assert fast_shapes == full_shapes  # every content event has the full path's envelope and keys
    n = body.get("n", 1)
    assert _relay_events(relays.fast, "sim-0", "spliced") - spliced_before >= n * (MAX_TOKENS - 4)
    assert _relay_events(relays.full, "sim-0", "spliced") == 0


def test_usage_finish_and_router_feedback_survive_the_splice(relays: Relays) -> None:
    before = _metrics(relays.fast)
    client = openai.OpenAI(base_url=relays.fast.url + "/v1", api_key=KEY, max_retries=0)
    chunks = list(client.chat.completions.create(
        model=SIM_MODEL, messages=[{"role": "user", "content": "Once more, with usage"}], max_tokens=MAX_TOKENS,
        temperature=0, seed=5, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == MAX_TOKENS
    # The client may read [DONE] before the server has closed the dispatch (the router's in-flight
    # count and the rest of the bookkeeping happen at that close): wait for it, bounded.
    until(lambda: metric_value(_metrics(relays.fast), "sluice_router_worker_in_flight", {"worker": "sim-0"}) == 0,
          "the dispatch closed after the stream's last event")
    after = _metrics(relays.fast)

    def grew(name: str, labels: dict[str, str]) -> float:
        return (metric_value(after, name, labels) or 0.0) - (metric_value(before, name, labels) or 0.0)

    assert grew("sluice_generation_tokens_total", {"model": SIM_MODEL}) == MAX_TOKENS
    assert grew("sluice_request_finished_total", {"model": SIM_MODEL, "finish_reason": "length"}) == 1
    assert grew("sluice_time_to_first_token_seconds_count", {"model": SIM_MODEL}) == 1
    assert grew("sluice_key_tokens_total", {"kind": "completion"}) == MAX_TOKENS
    # The router heard of the first token and of an answer that ran to its end, at its length.
    assert grew("sluice_router_actual_ttft_seconds_count", {"worker": "sim-0"}) == 1
    assert metric_value(after, "sluice_router_answer_tokens", {"model": SIM_MODEL}) == MAX_TOKENS
    assert metric_value(after, "sluice_router_worker_in_flight", {"worker": "sim-0"}) == 0


def test_a_client_that_leaves_is_charged_for_the_spliced_tokens(relays: Relays) -> None:
    before = metric_value(_metrics(relays.fast), "sluice_key_tokens_total", {"kind": "completion"}) or 0.0
    body = {"model": SIM_MODEL, "prompt": "Leave early", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    seen = 0
    with httpx.stream("POST", relays.fast.url + "/v1/completions", json=body, headers=HEADERS, timeout=60) as r:
        for line in r.iter_lines():
            seen += line.startswith("data: {")
            if seen == 12:
                break  # each content event carries at least one token
    charged = 0.0
    for _ in range(100):  # bounded: the gateway commits when it notices the client left
        charged = (metric_value(_metrics(relays.fast), "sluice_key_tokens_total", {"kind": "completion"}) or 0) - before
        if charged:
            break
        time.sleep(0.1)
    assert 12 <= charged < 2000


@pytest.mark.parametrize("gateway", ["fast", "full"])
def test_a_malformed_event_after_spliced_ones_ends_with_an_error_event(relays: Relays, gateway: str) -> None:
    server: Server = getattr(relays, gateway)
    spliced_before = _relay_events(server, "trt-0", "spliced")
    body = {"model": STANDIN_MODEL, "messages": [{"role": "user", "content": "standin-fault: midstream-bad-bytes"}],
            "max_tokens": 8, "stream": True}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, headers=HEADERS, timeout=60)
    assert r.status_code == 200
    assert b"\xff" not in r.content  # the worker's bytes never reach the client raw
    events = [e.removeprefix(b"data: ") for e in r.content.split(b"\n\n") if e]
    *answer, error, done = events
    assert done == b"[DONE]"
    assert orjson.loads(error)["error"]["type"] == "server_error"
    assert "worker trt-0 failed" in orjson.loads(error)["error"]["message"]
    texts = [orjson.loads(e)["choices"][0]["delta"].get("content") for e in answer]
    assert "".join(t or "" for t in texts).count(" t") == 3  # the three good tokens before the bad one
    if gateway == "fast":  # the stream was being spliced when the bad event came
        assert _relay_events(server, "trt-0", "spliced") - spliced_before >= 2
