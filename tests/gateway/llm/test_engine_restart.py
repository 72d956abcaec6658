"""The engine supervisor on the real SmolLM2 engine, in the real app under real uvicorn.

The gateway app runs in this process (uvicorn in a thread), so a test can break the
model's forward pass underneath the running continuous-batching thread, the one
failure a client cannot cause from outside. Two ways the thread dies:
- an Exception in the forward pass: transformers fails its requests and the thread exits;
- a BaseException: the thread exits without answering any request, which would hang
  every open stream if nothing watched the thread.
Either way the open requests must end with an error, `/health` must say 503 while the
engine is down and 200 once it is back, new requests must get 503 meanwhile, the restart
must be counted, and the next request must be answered correctly.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from engines import heap
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.servers import LLM_NAME, free_port, llm_only_repository, metric_value, wait_health

pytestmark = pytest.mark.integration

LONG = {"model": LLM_NAME, "messages": [{"role": "user", "content": "Write a long story about a ship."}],
        "max_tokens": 400, "temperature": 0, "ignore_eos": True}
PARIS = {"model": LLM_NAME, "messages": [{"role": "user", "content": "What is the capital of France?"}],
         "max_tokens": 12, "temperature": 0}


class InProcessGateway:
    def __init__(self, tmp: Path) -> None:
        port = free_port()
        settings = Settings(host="127.0.0.1", http_port=port, grpc_port=0,
                            model_repository=llm_only_repository(tmp), sse_ping_s=0.5)
        self.app = create_app(settings)
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def engine(self) -> Any:
        return self.app.state.sluice.llm.registry.models[LLM_NAME].backend.engine

    @property
    def model(self) -> Any:
        return self.engine._loaded.model  # the torch module the batching thread runs

    def restarts(self) -> float:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return metric_value(text, "sluice_engine_restarts_total", {"model": LLM_NAME}) or 0.0


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    g = InProcessGateway(tmp_path_factory.mktemp("restart"))
    g.thread.start()
    try:
        wait_health(g.url, 200, 300)
        yield g
    finally:
        g.server.should_exit = True
        g.thread.join(timeout=60)


def _events_after_first_content(lines: Iterator[str], on_first: Any) -> list[str]:
    """The data payloads of a stream; `on_first()` runs once the first content arrived."""
    out: list[str] = []
    fired = False
    for line in lines:
        if not line.startswith("data: "):
            continue
        out.append(line[6:])
        if not fired and '"content":"' in line and '"content":""' not in line:
            fired = True
            on_first()
    return out


def _answer(http: httpx.Client) -> str:
    r = http.post("/v1/chat/completions", json=PARIS)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


class ThreadKilled(BaseException):
    """Not an Exception: transformers' loop does not catch it, so it answers none of its requests."""


def test_failed_forward_passes_end_requests_and_the_engine_comes_back(gw: InProcessGateway) -> None:
    model, engine = gw.model, gw.engine
    broken = threading.Event()
    original = type(model).forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if broken.is_set():
            raise RuntimeError("injected forward failure")
        return original(model, *args, **kwargs)

    before = gw.restarts()
    with httpx.Client(base_url=gw.url, timeout=120) as http, ThreadPoolExecutor(1) as pool:
        plain = pool.submit(http.post, "/v1/chat/completions", json=LONG)  # a non-streaming request in flight

        def break_it() -> None:
            for _ in range(400):  # until the non-streaming request is in the batch too
                if engine.stats().running >= 2:
                    break
                time.sleep(0.05)
            model.forward = forward
            broken.set()

        try:
            with http.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as r:
                assert r.status_code == 200
                events = _events_after_first_content(r.iter_lines(), break_it)
            assert "error" in json.loads(events[-2]) and events[-1] == "[DONE]", events[-3:]
            failed = plain.result(timeout=120)
            assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error", failed.text

            # While forward passes still fail, every restart's warm-up fails: the engine stays down.
            assert http.get("/health").status_code == 503
            refused = http.post("/v1/chat/completions", json=PARIS)
            assert refused.status_code == 503 and "retry-after" in refused.headers, refused.text
            assert refused.json()["error"]["type"] == "server_error"
            refused = http.post("/v1/chat/completions", json={**PARIS, "stream": True})
            assert refused.status_code == 503 and "retry-after" in refused.headers
        finally:
            broken.clear()
            vars(model).pop("forward", None)
        wait_health(gw.url, 200, 120)
        assert gw.restarts() == before + 1
        assert not heap.frozen()  # the restart thawed the heap, so the dead manager's cycle is collectable
        assert "Paris" in _answer(http)


def test_a_thread_that_dies_without_answering_still_ends_its_streams(gw: InProcessGateway, monkeypatch) -> None:
    model = gw.model
    original_hook = threading.excepthook
    monkeypatch.setattr(threading, "excepthook",
                        lambda args: None if args.exc_type is ThreadKilled else original_hook(args))

    def forward(*args: Any, **kwargs: Any) -> Any:
        vars(model).pop("forward", None)  # once
        raise ThreadKilled()

    before = gw.restarts()
    with httpx.Client(base_url=gw.url, timeout=120) as http:
        try:
            with http.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as r:
                assert r.status_code == 200
                events = _events_after_first_content(r.iter_lines(), lambda: setattr(model, "forward", forward))
        finally:
            vars(model).pop("forward", None)
        error = json.loads(events[-2])["error"]
        assert "restarting" in error["message"] and events[-1] == "[DONE]", events[-3:]
        wait_health(gw.url, 200, 120)
        assert gw.restarts() == before + 1
        assert "Paris" in _answer(http)
