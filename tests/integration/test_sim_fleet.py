"""A live fleet of SIM workers in one process (`sluice worker --engine sim --replicas N`) behind a real gateway.

The sim is a modelled engine (no model runs); this checks the fleet plumbing only:
consecutive ports, one KV-event port pair per replica, one registration per replica,
requests routed to each, the profile labelled on /metrics, a non-streamed request aborted when
its client leaves, deregistration on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.integration.conftest import MODEL
from tests.integration.vllm_support import ROOT, tiny_llama_dir, wait_healthy
from tests.servers import Server, free_port, metric_value, start_server

pytestmark = pytest.mark.integration

REPLICAS = 3
PROFILE = "base_s=0.001,decode_seq_s=0.0005"


def _free_run(n: int) -> int:
    """A port p with p .. p+n-1 all free."""
    for _ in range(100):
        base = free_port()
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no run of {n} free ports")


@dataclass
class Fleet:
    gateway: Server
    proc: subprocess.Popen[bytes]
    port: int
    kv_port: int


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    (tmp / "repo").mkdir()
    gateway = start_server(["--model-repository", str(tmp / "repo")], tmp / "gateway.log", wait=False)
    port, kv_port = _free_run(REPLICAS), _free_run(2 * REPLICAS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim", "--model", str(tiny_llama_dir()),
         "--served-model-name", MODEL, "--port", str(port), "--kv-events-port", str(kv_port),
         "--replicas", str(REPLICAS), "--name", "fleet", "--profile", PROFILE, "--gateway", gateway.url],
        cwd=ROOT, start_new_session=True)
    try:
        for i in range(REPLICAS):
            wait_healthy(f"http://127.0.0.1:{port + i}", proc)
        for _ in range(300):  # bounded: registration follows the servers' start
            if len(_workers(gateway)) == REPLICAS:
                break
            time.sleep(0.1)
        yield Fleet(gateway, proc, port, kv_port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        gateway.stop()


def _workers(gateway: Server) -> dict[str, dict[str, object]]:
    return {w["name"]: w for w in httpx.get(gateway.url + "/v1/admin/workers", timeout=10).json()["data"]}


def test_each_replica_is_its_own_registered_worker(fleet: Fleet) -> None:
    workers = _workers(fleet.gateway)
    assert sorted(workers) == [f"fleet-{i}" for i in range(REPLICAS)]
    for i in range(REPLICAS):
        w = workers[f"fleet-{i}"]
        assert (w["url"], w["engine"], w["block_size"]) == (f"http://127.0.0.1:{fleet.port + i}", "sim", 128)
        sources = httpx.get(f"{w['url']}/kv_event_sources", timeout=10).json()["0"]
        assert (sources["endpoint"], sources["replay_endpoint"]) == (
            f"tcp://[::ffff:127.0.0.1]:{fleet.kv_port + 2 * i}", f"tcp://127.0.0.1:{fleet.kv_port + 2 * i + 1}")


def test_the_gateway_routes_to_every_replica(fleet: Fleet) -> None:
    seen = set()
    for k in range(3 * REPLICAS):
        r = httpx.post(fleet.gateway.url + "/v1/completions", headers={"X-Routing-Policy": "round_robin"},
                       json={"model": MODEL, "prompt": [50 + k] * 20, "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text
        seen.add(r.headers["x-sluice-worker"])
    assert seen == {f"fleet-{i}" for i in range(REPLICAS)}


async def test_the_router_learns_answer_lengths_from_answers_that_ran_to_their_end(fleet: Fleet) -> None:
    def learned() -> float | None:
        text = httpx.get(fleet.gateway.url + "/metrics", timeout=10).text
        return metric_value(text, "sluice_router_answer_tokens", {"model": MODEL})

    async with httpx.AsyncClient(base_url=fleet.gateway.url, timeout=60) as http:
        for k in range(8):
            r = await http.post("/v1/completions", json={"model": MODEL, "prompt": [900 + k] * 20, "max_tokens": 40,
                                                         "ignore_eos": True})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 40, r.text
        after_whole = learned()
        assert after_whole is not None and 2 < after_whole <= 40
        # An answer its client left after the first token says nothing about answer lengths.
        body = {"model": MODEL, "prompt": [950] * 20, "max_tokens": 1500, "ignore_eos": True, "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    break
        for _ in range(100):  # bounded: the gateway sees the hang-up and ends the dispatch
            if not any(w["in_flight"] for w in _workers(fleet.gateway).values()):
                break
            await asyncio.sleep(0.05)
    assert learned() == after_whole


def test_the_profile_is_labelled_on_metrics_and_the_model_card(fleet: Fleet) -> None:
    url = f"http://127.0.0.1:{fleet.port}"
    text = httpx.get(url + "/metrics", timeout=10).text
    assert metric_value(text, "sluice_sim_info", {"profile": f"numbers:{PROFILE}", "source": "numbers"}) == 1
    card = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]
    assert (card["owned_by"], card["sim_profile"]) == ("sluice-sim", f"numbers:{PROFILE}")


async def test_a_non_streamed_request_is_aborted_when_its_client_leaves(fleet: Fleet) -> None:
    url = f"http://127.0.0.1:{fleet.port + 1}"

    def metric(name: str) -> float:
        return metric_value(httpx.get(url + "/metrics", timeout=10).text, name) or 0.0

    body = {"model": MODEL, "prompt": [9] * 30, "max_tokens": 1900, "ignore_eos": True}
    before = metric("vllm:generation_tokens_total")
    async with httpx.AsyncClient(timeout=60) as client:
        waiting = asyncio.create_task(client.post(url + "/v1/completions", json=body))
        for _ in range(200):  # bounded: until it runs
            if metric("vllm:num_requests_running") == 1:
                break
            await asyncio.sleep(0.05)
        waiting.cancel()  # closes the connection
        await asyncio.gather(waiting, return_exceptions=True)
    for _ in range(200):  # bounded: the abort lands within a step or two
        if metric("vllm:num_requests_running") == 0:
            break
        await asyncio.sleep(0.05)
    assert metric("vllm:num_requests_running") == 0
    assert metric("vllm:generation_tokens_total") - before < 1900


def test_sigterm_deregisters_every_replica(fleet: Fleet) -> None:
    fleet.proc.send_signal(signal.SIGTERM)
    assert fleet.proc.wait(timeout=60) == 0
    assert _workers(fleet.gateway) == {}
