"""Thousands of connections from one address, on a real gateway with its default connection
bounds, started with a soft fd limit of 1,024 (as a systemd service gets) and a larger hard one.

- A burst of 2,000 connections from 127.0.0.1, all open before any sends its request, is answered
  whole: connections that have not sent their first request are not held to the per-address bound
  on kept-alive connections (256), and the gateway raised its fd limit to hold them.
- 700 chat streams at once (two sockets each in the gateway: 1,400 fds) through a paced sim fleet
  all finish whole.
"""

from __future__ import annotations

import asyncio
import resource
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from openai import AsyncOpenAI

from tests.integration.test_fleet_capacity import Streams, _capacity, _fleet
from tests.servers import Server, metric_value, start_server

pytestmark = pytest.mark.integration

BURST = 2000
STREAMS = 700
TOKENS = 12  # at a step every 0.5 s: 6 s and more, so all streams are open at once
MODEL = "burst"
SOFT = 1024


def _soft_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@dataclass
class Gateway:
    server: Server
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if (hard != resource.RLIM_INFINITY and hard < 2 * BURST + 1024) or soft < BURST + 256:
        pytest.skip(f"needs fd limits above {2 * BURST + 1024} (hard) and {BURST + 256} (soft, this process)")
    tmp = tmp_path_factory.mktemp("burst")
    (tmp / "repo").mkdir()
    # Default connection bounds, admission and in-flight cap: no flags but the repository.
    out = Gateway(start_server(["--model-repository", str(tmp / "repo")], tmp / "gateway.log", wait=False,
                               preexec_fn=_soft_fd_limit))
    try:
        out.procs.append(_fleet(out.server, MODEL, 2, "--max-num-seqs", "400"))
        for _ in range(300):  # bounded: registration follows the workers' start
            if _capacity(out.server, MODEL) == 800:
                break
            time.sleep(0.1)
        yield out
    finally:
        for proc in out.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.server.stop()


def _closed_by_bounds(server: Server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return sum(metric_value(text, "sluice_http_connections_closed_total", {"reason": r}) or 0.0
               for r in ("idle_per_client", "idle_total", "fresh_total", "header_timeout"))


async def _burst(port: int) -> list[bytes]:
    """`BURST` connections from 127.0.0.1, all open before any sends; then each asks for /v1/models."""
    conns = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port) for _ in range(BURST)))
    try:
        for _, writer in conns:
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")

        async def answer(reader: asyncio.StreamReader) -> bytes:
            try:
                return await asyncio.wait_for(reader.read(), 120)  # bounds only a server that never answers
            except (OSError, TimeoutError) as e:
                return repr(e).encode()

        return list(await asyncio.gather(*(answer(reader) for reader, _ in conns)))
    finally:
        for _, writer in conns:
            writer.close()


def test_the_soft_fd_limit_is_raised_and_logged(gateway: Gateway) -> None:
    assert f"fd limit raised from {SOFT} to" in gateway.server.log()


async def test_a_burst_of_2000_fresh_connections_from_one_address_is_answered_whole(gateway: Gateway) -> None:
    before = _closed_by_bounds(gateway.server)
    answers = await _burst(gateway.server.http_port)
    bad = [a[:80] for a in answers if not a.startswith(b"HTTP/1.1 200 ")]
    assert not bad, f"{len(bad)} of {BURST} not answered 200, e.g. {bad[:3]}"
    assert _closed_by_bounds(gateway.server) == before


async def test_700_streams_at_once_past_the_soft_fd_limit_finish_whole(gateway: Gateway) -> None:
    assert _capacity(gateway.server, MODEL) == 800
    streams = Streams()
    async with AsyncOpenAI(base_url=gateway.server.url + "/v1", api_key="none", max_retries=0,
                           timeout=300) as client:
        results = await asyncio.gather(*(streams.chat(client, MODEL, k, TOKENS) for k in range(STREAMS)),
                                       return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, f"{len(failures)} of {STREAMS} failed, e.g. {failures[0]!r}"
    assert all(r == (TOKENS, "length") for r in results), [r for r in results if r != (TOKENS, "length")][:5]
    assert streams.peak > 600  # 1,200 and more gateway sockets at once, past the soft limit it started with
