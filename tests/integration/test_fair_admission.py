"""Fair, priority- and deadline-aware admission through a real `sluice serve` in front of a sim
worker, with the official openai client: two keys, two slots (`--max-running 2`), a short queue.

A flood key keeps ten streams going back to back; a quiet key then sends a few. Under fair
queuing (the default) each quiet request is admitted at the next free slot, ahead of the flood's
queue: at most a slot's worth of flood requests get their first token between its sending and its
own first token. The same traffic through a gateway with `--admission-order fcfs` shows the
contrast: there the quiet request waits behind the whole queue, or is turned away. Order is what is
asserted, never a duration.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml
from openai import APIError, APIStatusError, AsyncOpenAI

from tests.integration.conftest import MODEL
from tests.integration.vllm_support import sim_worker
from tests.servers import Server, metric_value, start_server

pytestmark = pytest.mark.integration

PROFILE = "base_s=0.05,decode_seq_s=0.0001"  # a step every 50 ms: a 12-token answer holds its slot ~0.6 s
FLOOD, QUIET, BATCH = "sk-flood-0123456789", "sk-quiet-0123456789", "sk-batch-0123456789"
RUNNING, QUEUED = 2, 6


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with sim_worker(MODEL, PROFILE) as url:
        yield url


def _gateway(sim_url: str, tmp: Path, order: str) -> Server:
    (tmp / "repo").mkdir(parents=True)
    keys = tmp / "keys.yaml"
    keys.write_text(yaml.safe_dump([{"id": "flood", "key": FLOOD}, {"id": "quiet", "key": QUIET,
                                                                      "max_priority": "interactive"},
                                    {"id": "etl", "key": BATCH, "priority": "batch"}]))
    return start_server(["--model-repository", str(tmp / "repo"), "--worker", f"sim={sim_url}",
                         "--api-keys-file", str(keys), "--max-running", str(RUNNING), "--max-queued", str(QUEUED),
                         "--admission-order", order], tmp / "gateway.log")


@dataclass
class Traffic:
    first_tokens: list[float] = field(default_factory=list)  # the flood's, client clock
    refused: int = 0


async def _stream(client: AsyncOpenAI, headers: dict[str, str] | None = None) -> float:
    """One streamed chat; the time its first content arrived."""
    stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=12, stream=True, extra_headers=headers)
    first = 0.0
    async for chunk in stream:
        if not first and chunk.choices and chunk.choices[0].delta.content:
            first = time.monotonic()
    return first


async def _flood(client: AsyncOpenAI, traffic: Traffic, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            traffic.first_tokens.append(await _stream(client))
        except (APIStatusError, APIError):
            traffic.refused += 1  # a 503, or pushed out of the queue after its headers
            await asyncio.sleep(0.02)


async def _quiet_against_flood(server: Server) -> tuple[list[int], int, Traffic]:
    """For each of 3 quiet requests, how many flood requests got their first token while it waited;
    and how many quiet requests were refused."""
    flood = AsyncOpenAI(base_url=server.url + "/v1", api_key=FLOOD, max_retries=0, timeout=120)
    quiet = AsyncOpenAI(base_url=server.url + "/v1", api_key=QUIET, max_retries=0, timeout=120)
    traffic, stop = Traffic(), asyncio.Event()
    loops = [asyncio.create_task(_flood(flood, traffic, stop)) for _ in range(10)]
    overtaken, refused = [], 0
    try:
        await _until_queued(server, QUEUED)
        for _ in range(3):
            sent = time.monotonic()
            try:
                first = await _stream(quiet)
            except APIStatusError:
                refused += 1
                continue
            overtaken.append(sum(1 for t in traffic.first_tokens if sent < t < first))
    finally:
        stop.set()
        await asyncio.gather(*loops)
    return overtaken, refused, traffic


def test_a_flood_from_one_key_does_not_starve_another(sim_url: str, tmp_path: Path) -> None:
    fair = _gateway(sim_url, tmp_path / "fair", "fair")
    try:
        overtaken, refused, traffic = asyncio.run(_quiet_against_flood(fair))
        metrics = httpx.get(fair.url + "/metrics").text
    finally:
        fair.stop()
    assert refused == 0 and len(overtaken) == 3
    # Only flood requests already admitted when it arrived (one per slot) may show a first token first.
    assert max(overtaken) <= RUNNING, overtaken
    assert traffic.refused > 0 and traffic.first_tokens
    assert (metric_value(metrics, "sluice_tenant_refused_total", {"tenant": "flood", "reason": "evicted"}) or 0) > 0
    for reason in ("queue_full", "evicted"):
        assert metric_value(metrics, "sluice_tenant_refused_total", {"tenant": "quiet", "reason": reason}) == 0
    assert (metric_value(metrics, "sluice_tenant_tokens_total", {"tenant": "quiet", "priority": "standard"})
            or 0) > 0

    fcfs = _gateway(sim_url, tmp_path / "fcfs", "fcfs")
    try:
        overtaken, refused, _ = asyncio.run(_quiet_against_flood(fcfs))
    finally:
        fcfs.stop()
    # First come, first served: the quiet key waits behind the flood's queue, or bounces off it.
    assert refused > 0 or max(overtaken) > RUNNING, (refused, overtaken)


def test_priority_and_deadlines_through_the_gateway(sim_url: str, tmp_path: Path) -> None:
    server = _gateway(sim_url, tmp_path, "fair")
    try:
        asyncio.run(_priority_and_deadlines(server))
    finally:
        server.stop()


async def _priority_and_deadlines(server: Server) -> None:
    quiet = AsyncOpenAI(base_url=server.url + "/v1", api_key=QUIET, max_retries=0, timeout=120)
    etl = AsyncOpenAI(base_url=server.url + "/v1", api_key=BATCH, max_retries=0, timeout=120)
    with pytest.raises(APIStatusError) as e:  # above what the key allows
        await _stream(etl, {"X-Sluice-Priority": "interactive"})
    assert e.value.status_code == 403 and e.value.body["code"] == "priority_not_allowed"
    with pytest.raises(APIStatusError) as e:
        await _stream(quiet, {"X-Sluice-TTFT-Deadline-Ms": "soon"})
    assert e.value.status_code == 400 and e.value.body["code"] == "invalid_deadline"
    # Fill both slots and the queue with batch work, then an interactive request goes next.
    batch = [asyncio.create_task(_stream(etl)) for _ in range(RUNNING + QUEUED - 1)]
    await _until_queued(server, QUEUED - 1)
    urgent = await _stream(quiet, {"X-Sluice-Priority": "interactive"})
    # A deadline no queue can meet: refused before any byte, in OpenAI's error shape, with Retry-After.
    with pytest.raises(APIStatusError) as e:
        await _stream(quiet, {"X-Sluice-TTFT-Deadline-Ms": "1"})
    assert e.value.status_code == 503 and e.value.body["code"] in ("deadline_unmeetable", "deadline_exceeded")
    assert int(e.value.response.headers["retry-after"]) >= 1
    firsts = sorted(await asyncio.gather(*batch))
    assert sum(1 for t in firsts if t < urgent) <= RUNNING  # only the batch requests already running


async def _until_queued(server: Server, n: int) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(600):
            text = (await http.get(server.url + "/metrics")).text
            if (metric_value(text, "sluice_requests_queued", {"model": MODEL}) or 0) >= n:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{n} requests never queued (the flood never filled the queue?)")
