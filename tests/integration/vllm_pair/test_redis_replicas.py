"""Two gateway replicas share routing state through one real redis-server (issue 4).

A conversation started on replica A and continued on replica B reaches the
same vLLM worker, unless the cost model prices that worker dearer. With KV
events every replica also learns placements from the workers themselves, so
the second test registers the workers without events (approximate mode):
there, what B knows about A's requests can only have come through Redis, and a
replica without Redis is shown not to know it.

What is promised is the router's decision, not the worker: the load a replica
sees is eventually consistent (other replicas' in-flight requests and queued
prefill arrive every `load_interval_s`, a worker's own count every scrape), so
right after A's turn ends B may still see it running or prefilling there, and
may then rightly send the next turn elsewhere with the reason `load` (seen on a
busy machine: one turn in six). So each test first waits until B's view of the
load has caught up, as far as B's metrics show it, and then checks that a turn
either is a prefix hit on its first turn's worker, with that cache used, or
went elsewhere for load, knowing a worker held more of its prompt.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import BLOCK, MODEL, WORKER_KEY, Worker, gateway_over
from tests.servers import Server, free_port, llm_only_repository, metric_value, start_server, until

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


def _settled(server: Server, workers: list[Worker], timeout_s: float = 60.0) -> None:
    """Until `server` sees no queued prefill and no running request on any worker (see the module
    docstring; other replicas' in-flight counts are not in its metrics, so they may still lag)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = httpx.get(server.url + "/metrics", timeout=10).text
        if all(not metric_value(text, name, {"worker": w.name})
               for w in workers for name in ("sluice_router_worker_queued_prefill_tokens",
                                             "sluice_router_worker_requests_running")):
            return
        time.sleep(0.1)
    raise AssertionError(f"{server.url} still sees load after {timeout_s} s")


def _index_blocks(server: Server) -> dict[str, int]:
    rows = httpx.get(server.url + "/v1/admin/workers", timeout=10).json()["data"]
    return {row["name"]: row["index_blocks"] for row in rows}


def _synced(source: Server, replica: Server, worker: str) -> None:
    """Until `replica` indexes at least the blocks `source` placed on `worker` (Redis carries them;
    on a starved machine that took longer than the follow-up turn took to be sent)."""
    until(lambda: _index_blocks(replica).get(worker, 0) >= _index_blocks(source).get(worker, 0) > 0,
          f"{replica.url} indexes what {source.url} placed on {worker}", timeout_s=60)


def _kept(first: dict[str, str], second: dict[str, str], i: int) -> bool:
    """True when the continued turn (response headers `second`) stayed on its first turn's worker
    as a prefix hit; False when the router sent it elsewhere for load. Anything else fails."""
    reason = second["x-sluice-route-reason"]
    assert reason in ("prefix_hit", "load"), (i, first, second)
    if reason == "load":  # a worker held more of the prompt; the cost model priced it dearer
        return False
    assert second["x-sluice-worker"] == first["x-sluice-worker"], (i, first, second)
    return True


def _stop_all(servers: list[Server]) -> None:
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def replicas(workers: list[Worker], redis_url: str, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[Server, Server]]:
    """Two gateway replicas in front of both workers, sharing one Redis."""
    tmp = tmp_path_factory.mktemp("replicas")
    a = gateway_over(workers, tmp / "a", "--redis-url", redis_url)
    try:
        b = gateway_over(workers, tmp / "b", "--redis-url", redis_url)
    except BaseException:
        a.stop()
        raise
    yield a, b
    _stop_all([b, a])


def test_conversation_moves_replica_but_keeps_its_worker(workers: list[Worker], replicas: tuple[Server, Server]
                                                         ) -> None:
    a, b = replicas
    kept: list[int] = []
    for i in range(CONVERSATIONS):
        messages = _opening("events", i)
        h1, first = _chat(a, messages)
        _settled(b, workers)
        h2, second = _chat(b, _continue(messages, first, i))
        if _kept(h1, h2, i):
            kept.append(i)
            # The continuation really used the cache its first turn left on that worker.
            cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached >= 3 * BLOCK, (i, cached)
    assert any(kept), "every continued turn went elsewhere for load"


def test_a_stored_response_continues_on_the_other_replica(replicas: tuple[Server, Server]) -> None:
    """`previous_response_id` from replica A, continued on replica B: the record came through Redis."""
    a, b = replicas
    first = httpx.post(a.url + "/v1/responses", timeout=120, json={
        "model": MODEL, "input": "Remember the number 7.", "max_output_tokens": 4, "temperature": 0})
    assert first.status_code == 200, first.text
    body = {"model": MODEL, "input": "Which number?", "max_output_tokens": 4, "temperature": 0}
    alone = httpx.post(b.url + "/v1/responses", timeout=120, json={**body, "store": False}).json()
    second = httpx.post(b.url + "/v1/responses", timeout=120,
                        json={**body, "previous_response_id": first.json()["id"]})
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["input_tokens"] > alone["usage"]["input_tokens"] + 4
    assert httpx.get(b.url + f"/v1/responses/{first.json()['id']}", timeout=30).json()["id"] == first.json()["id"]
    assert httpx.delete(b.url + f"/v1/responses/{first.json()['id']}", timeout=30).status_code == 200
    assert httpx.get(a.url + f"/v1/responses/{first.json()['id']}", timeout=30).status_code == 404  # everywhere


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
    return start_server([*args, *extra], tmp / "gateway.log", env={"SLUICE_WORKER_KEY": WORKER_KEY})


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
        kept: list[int] = []
        for i in range(CONVERSATIONS):
            messages = _opening("approx", i)
            h1, first = _chat(a, messages)
            follow_up = _continue(messages, first, i)
            # Asked first, and it routes nothing: the lone replica's view stays empty.
            tok = httpx.post(alone.url + "/tokenize", json={"model": MODEL, "messages": follow_up}).json()
            _settled(b, workers)
            _synced(a, b, h1["x-sluice-worker"])
            h2, second = _chat(b, follow_up)
            if not _kept(h1, h2, i):
                continue
            kept.append(i)
            # Only Redis can have told B this much of the prompt is on that worker.
            predicted = int(h2["x-sluice-predicted-cached-tokens"])
            reported = second["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert predicted >= 3 * BLOCK and abs(predicted - reported) <= BLOCK, (predicted, reported)
            assert tok["count"] > predicted
        assert kept, "every continued turn went elsewhere for load"
        # The replica without Redis never saw these prompts: it predicts no cache at all.
        h3, _ = _chat(alone, follow_up)
        assert h3["x-sluice-route-reason"] == "no_prefix" and h3["x-sluice-predicted-cached-tokens"] == "0", h3
    finally:
        _stop_all(list(reversed(started)))
