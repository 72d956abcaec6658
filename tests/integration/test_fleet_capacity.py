"""Admission sized by the fleet: a real gateway with its default capacity settings, in front of two
real sim fleets (`sluice worker --engine sim --replicas N`, paced slowly so that streams overlap).

- `big`: 4 workers of the sim's default max_num_seqs (128). 400 concurrent chat streams, more than
  the 320 the old global cap (64 running + 256 queued per model) held, all finish whole, no 503.
- `small`: 2 workers with --max-num-seqs 2, so the model's capacity is 4 and its gateway queue 4.
  Of 16 streams 8 get in; the rest get a 503 with Retry-After in the protocol's own error JSON
  (OpenAI, KServe generate) while the admitted ones are still running.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from openai import APIStatusError, AsyncOpenAI

from tests.integration.test_sim_fleet import _free_run
from tests.integration.vllm_support import ROOT, tiny_llama_dir, wait_healthy
from tests.servers import Server, metric_value, start_server

pytestmark = pytest.mark.integration

# A step at least every 0.5 s whatever the batch: a 40-token answer takes 20 s and more, so all
# streams are open at once on a loaded 2-core machine, while the gateway relays little.
PROFILE = "base_s=0.5,decode_seq_s=0.0001"
TOKENS = 40
SMALL_TOKENS = 12  # the small fleet's answers: 6 s and more
BIG, SMALL = "big", "small"


@dataclass
class Fleets:
    gateway: Server
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


def _fleet(gateway: Server, model: str, replicas: int, *extra: str) -> subprocess.Popen[bytes]:
    port, kv_port = _free_run(replicas), _free_run(2 * replicas)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim", "--model", str(tiny_llama_dir()),
         "--served-model-name", model, "--port", str(port), "--kv-events-port", str(kv_port),
         "--replicas", str(replicas), "--name", model, "--profile", PROFILE, "--gateway", gateway.url, *extra],
        cwd=ROOT, start_new_session=True)
    for i in range(replicas):
        wait_healthy(f"http://127.0.0.1:{port + i}", proc)
    return proc


@pytest.fixture(scope="module")
def fleets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleets]:
    tmp = tmp_path_factory.mktemp("capacity")
    (tmp / "repo").mkdir()
    # Defaults for admission, in-flight requests and connection bounds: no --max-running,
    # --max-queued, --max-inflight-requests or --max-idle-connections-per-client. The 400 streams
    # come from one address: their fresh connections are not held to its kept-alive bound (256).
    out = Fleets(start_server(["--model-repository", str(tmp / "repo")], tmp / "gateway.log", wait=False))
    try:
        out.procs.append(_fleet(out.gateway, BIG, 4))
        out.procs.append(_fleet(out.gateway, SMALL, 2, "--max-num-seqs", "2"))
        for _ in range(300):  # bounded: registration follows the servers' start
            if _capacity(out.gateway, BIG) == 512 and _capacity(out.gateway, SMALL) == 4:
                break
            time.sleep(0.1)
        yield out
    finally:
        for proc in out.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.gateway.stop()


def _capacity(gateway: Server, model: str) -> float | None:
    try:
        text = httpx.get(gateway.url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    return metric_value(text, "sluice_model_capacity", {"model": model})


def _idle_closed(gateway: Server) -> str:
    text = httpx.get(gateway.url + "/metrics", timeout=10).text
    return "; ".join(line for line in text.splitlines() if line.startswith("sluice_http_connections_closed"))


class Streams:
    """Counts streams between their first chunk and their end: the peak is how many ran at once."""

    def __init__(self) -> None:
        self.open = self.peak = 0

    async def chat(self, client: AsyncOpenAI, model: str, k: int, tokens: int = TOKENS
                   ) -> tuple[int | None, str | None]:
        """(completion tokens, finish reason) of one streamed chat answer, from its own chunks."""
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"user {k} asks"}], max_tokens=tokens,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        tokens, reason, started = None, None, False
        try:
            async for chunk in stream:
                if not started:
                    started = True
                    self.open += 1
                    self.peak = max(self.peak, self.open)
                if chunk.choices and chunk.choices[0].finish_reason:
                    reason = chunk.choices[0].finish_reason
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
        finally:
            if started:
                self.open -= 1
        return tokens, reason


async def test_400_streams_over_four_workers_all_finish_whole(fleets: Fleets) -> None:
    assert _capacity(fleets.gateway, BIG) == 4 * 128
    streams = Streams()
    # The SDK's own pool holds up to 1,000 connections.
    async with AsyncOpenAI(base_url=fleets.gateway.url + "/v1", api_key="none", max_retries=0,
                           timeout=300) as client:
        results = await asyncio.gather(*(streams.chat(client, BIG, k) for k in range(400)),
                                       return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, f"{len(failures)} of 400 failed, e.g. {failures[0]!r}: {_idle_closed(fleets.gateway)}"
    assert all(r == (TOKENS, "length") for r in results), [r for r in results if r != (TOKENS, "length")][:5]
    assert streams.peak > 320  # more ran at once than the old cap let into the gateway at all


async def test_a_fleet_without_room_answers_the_excess_with_503(fleets: Fleets) -> None:
    assert _capacity(fleets.gateway, SMALL) == 4
    streams = Streams()
    refused: list[tuple[int, str | None, object]] = []
    admitted_done: list[int] = []

    async def one(client: AsyncOpenAI, k: int) -> None:
        try:
            await streams.chat(client, SMALL, k, SMALL_TOKENS)
            admitted_done.append(k)
        except APIStatusError as e:
            # Refused before any admitted stream finished: the 503 does not wait for room.
            refused.append((e.status_code, e.response.headers.get("retry-after"), e.body))
            assert not admitted_done

    async with AsyncOpenAI(base_url=fleets.gateway.url + "/v1", api_key="none", max_retries=0) as client:
        await asyncio.gather(*(one(client, k) for k in range(16)))
    assert len(admitted_done) == 8 and len(refused) == 8  # 4 run, 4 wait in the gateway
    for status, retry_after, body in refused:
        assert status == 503 and retry_after == "1"
        assert isinstance(body, dict) and body.get("code") == "queue_full", body


async def test_the_kserve_generate_route_refuses_the_excess_in_its_own_format(fleets: Fleets) -> None:
    body = {"text_input": "hello", "parameters": {"max_tokens": SMALL_TOKENS, "ignore_eos": True}}
    async with httpx.AsyncClient(base_url=fleets.gateway.url, timeout=300) as http:
        answers = await asyncio.gather(*(http.post(f"/v2/models/{SMALL}/generate", json=body) for _ in range(12)))
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] * 8 + [503] * 4, codes
    for r in answers:
        if r.status_code == 503:
            assert r.headers["retry-after"] == "1"
            assert set(r.json()) == {"error"} and "overloaded" in r.json()["error"]
