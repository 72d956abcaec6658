"""Two gateway replicas share routing state through one real redis-server (issue 4).

A conversation started on replica A and continued on replica B must reach the
same vLLM worker. With KV events every replica also learns placements from the
workers themselves, so the second test registers the workers without events
(approximate mode): there, what B knows about A's requests can only have come
through Redis, and a replica without Redis is shown not to know it.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import BLOCK, MODEL, Worker, gateway_over
from tests.servers import Server, free_port, llm_only_repository, start_server

pytestmark = [
    pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed (make apt)"),
]

# Long enough for several full blocks, distinct from other modules' prompts.
SYSTEM = " ".join(f"Clause {i}: the ferry to island {i} leaves at dawn unless the wind from the north "
                  f"exceeds force {i % 9 + 1}; passengers carry their own lanterns." for i in range(1, 11))
CONVERSATIONS = 6


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A throw-away redis-server on loopback, without persistence."""
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(400):  # bounded wait for readiness
            if proc.poll() is not None:
                raise RuntimeError("redis-server exited at start-up")
            try:
                import redis

                if redis.Redis(port=port, socket_connect_timeout=0.2).ping():
                    break
            except Exception:
                time.sleep(0.025)
        else:
            raise RuntimeError("redis-server did not become ready")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(10)


def _opening(tag: str, i: int) -> list[dict[str, str]]:
    doc = " ".join(f"Entry {k} of log {tag}-{i}: crate {k * 13 + i} went to pier {i}." for k in range(12))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": doc}]


def _chat(server: Server, messages: list[dict[str, str]]) -> tuple[dict[str, str], dict]:
    r = httpx.post(server.url + "/v1/chat/completions", timeout=300, json={
        "model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 8, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return dict(r.headers), r.json()


def _continue(messages: list[dict[str, str]], answer: dict, i: int) -> list[dict[str, str]]:
    content = answer["choices"][0]["message"]["content"] or ""
    return [*messages, {"role": "assistant", "content": content}, {"role": "user", "content": f"And pier {i}?"}]


def _stop_all(servers: list[Server]) -> None:
    for s in servers:
        s.stop()


def test_conversation_moves_replica_but_keeps_its_worker(workers: list[Worker], redis_url: str,
                                                         tmp_path: Path) -> None:
    a = gateway_over(workers, tmp_path / "a", "--redis-url", redis_url)
    try:
        b = gateway_over(workers, tmp_path / "b", "--redis-url", redis_url)
    except BaseException:
        a.stop()
        raise
    try:
        placements = []
        for i in range(CONVERSATIONS):
            messages = _opening("events", i)
            h1, first = _chat(a, messages)
            h2, second = _chat(b, _continue(messages, first, i))
            placements.append((h1["x-sluice-worker"], h2["x-sluice-worker"],
                               second["usage"]["prompt_tokens_details"]["cached_tokens"]))
        assert all(w1 == w2 for w1, w2, _ in placements), placements
        # The continuation really used the cache its first turn left on that worker.
        assert all(cached >= 3 * BLOCK for _, _, cached in placements), placements
    finally:
        _stop_all([b, a])


def _workers_file(workers: list[Worker], path: Path) -> Path:
    """Workers registered as plain OpenAI servers: no KV-event discovery, approximate mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"- {{name: {w.name}, url: '{w.url}', engine: openai, models: [{MODEL}], "
                            f"tokenizer: '{_tokenizer_dir()}'}}\n" for w in workers))
    return path


def _tokenizer_dir() -> str:
    from tests.integration.vllm_support import tiny_llama_dir

    return str(tiny_llama_dir())


def _approx_gateway(workers: list[Worker], tmp: Path, *extra: str) -> Server:
    tmp.mkdir(parents=True, exist_ok=True)
    args = ["--model-repository", str(llm_only_repository(tmp)),
            "--workers-file", str(_workers_file(workers, tmp / "workers.yaml"))]
    return start_server([*args, *extra], tmp / "gateway.log")


def test_without_events_only_redis_carries_the_placement(workers: list[Worker], redis_url: str,
                                                         tmp_path: Path) -> None:
    started: list[Server] = []
    try:
        a = _approx_gateway(workers, tmp_path / "a", "--redis-url", redis_url)
        started.append(a)
        b = _approx_gateway(workers, tmp_path / "b", "--redis-url", redis_url)
        started.append(b)
        alone = _approx_gateway(workers, tmp_path / "alone")  # same registration, no Redis
        started.append(alone)
        for i in range(CONVERSATIONS):
            messages = _opening("approx", i)
            h1, first = _chat(a, messages)
            follow_up = _continue(messages, first, i)
            # Asked first, and it routes nothing: the lone replica's view stays empty.
            tok = httpx.post(alone.url + "/tokenize", json={"model": MODEL, "messages": follow_up}).json()
            h2, second = _chat(b, follow_up)
            assert h2["x-sluice-worker"] == h1["x-sluice-worker"], (i, h1, h2)
            assert h2["x-sluice-route-reason"] == "prefix_hit", h2
            predicted = int(h2["x-sluice-predicted-cached-tokens"])
            reported = second["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert predicted >= 3 * BLOCK and abs(predicted - reported) <= BLOCK, (predicted, reported)
            assert tok["count"] > predicted
        # The replica without Redis never saw these prompts: it predicts no cache at all.
        h3, _ = _chat(alone, follow_up)
        assert h3["x-sluice-route-reason"] == "no_prefix" and h3["x-sluice-predicted-cached-tokens"] == "0", h3
    finally:
        _stop_all(list(reversed(started)))
