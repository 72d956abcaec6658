"""The traffic bench_admission.py sends: tenants' requests over a lean streaming client, open-loop
(Poisson) and closed-loop arrivals, and the sim fleet with one gateway at a time in front of it."""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from loadtests.lib import procs
from loadtests.lib.stream_client import StreamConn, StreamResult

REPORTS = procs.ROOT / "loadtests" / "reports"
TENANTS = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "w1": 1.0, "w2": 2.0, "w3": 3.0}


def key(tenant: str) -> str:
    return f"sk-bench-{tenant}-000000000000"


@dataclass
class Req:
    tenant: str
    sent: float  # seconds from the scenario's start
    status: int = 0
    ttft_s: float | None = None
    end_s: float | None = None
    tokens: int = 0  # prompt + completion, as the usage chunk said
    predicted_s: float | None = None
    error: str | None = None


@dataclass
class Target:
    name: str
    port: int
    keyed: bool  # sends each tenant's key (vllm-router: no keys)
    done: list[Req] = field(default_factory=list)


async def one(target: Target, tenant: str, t0: float, args: argparse.Namespace,
              headers: dict[str, str] | None = None) -> Req:
    h = dict(headers or {})
    if target.keyed:
        h["Authorization"] = f"Bearer {key(tenant)}"
    body = {"model": procs.MODEL, "prompt": f"{tenant} {random.random()} " + "tell me a story " * 12,
            "max_tokens": args.output_len, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    req = Req(tenant, time.perf_counter() - t0)
    conn = StreamConn("127.0.0.1", target.port)
    try:
        r: StreamResult = await conn.post_stream("/v1/completions", body, h)
        req.status, req.ttft_s, req.error = r.status, r.ttft_s, r.error
        req.tokens = r.prompt_tokens + r.completion_tokens if r.status == 200 and not r.error else 0
        req.end_s = r.end_s - t0
        if "x-sluice-predicted-ttft-ms" in r.headers:
            req.predicted_s = int(r.headers["x-sluice-predicted-ttft-ms"]) / 1000
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        req.error = repr(e)[:200]
    finally:
        await conn.close()
    target.done.append(req)
    return req


async def poisson(rate: float, duration_s: float, start_s: float, fire: Callable[[], Awaitable[Req]],
                  rng: random.Random) -> None:
    """Open-loop arrivals at `rate`/s for `duration_s`, starting `start_s` in."""
    await asyncio.sleep(start_s)
    end = time.perf_counter() + duration_s
    tasks = []
    while time.perf_counter() < end:
        tasks.append(asyncio.create_task(fire()))
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)


async def closed(loops: int, duration_s: float, fire: Callable[[], Awaitable[Req]]) -> None:
    """`loops` clients, each sending its next request when the last one ends (20 ms after a refusal)."""
    end = time.perf_counter() + duration_s

    async def loop() -> None:
        while time.perf_counter() < end:
            r = await fire()
            if r.status != 200 or r.error:
                await asyncio.sleep(0.02)
    await asyncio.gather(*(loop() for _ in range(loops)))


class Bench:
    """The fleet (sim workers, or with `--vllm` real vLLM CPU workers), and the gateways in front of it,
    one at a time."""

    def __init__(self, scratch: Path, args: argparse.Namespace) -> None:
        self.scratch, self.args = scratch, args
        self.base, self.kv = procs.free_ports(2, span=2 * args.workers + 2)
        self.ports = [self.base + i for i in range(args.workers)]
        if args.vllm:
            env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
            self.fleet = [procs.spawn([sys.executable, "-m", "engines.launchers", "--engine", "vllm", "--model",
                                       procs.MODEL, "--port", str(p), "--name", f"vllm-{i}", "--", "--max-num-seqs",
                                       str(args.max_num_seqs)], scratch / f"vllm-{i}.log", env)
                          for i, p in enumerate(self.ports)]
            for p, proc in zip(self.ports, self.fleet, strict=True):
                procs.wait_ok(f"http://127.0.0.1:{p}", proc, timeout_s=900)
        else:
            self.fleet = [procs.sim_fleet(self.base, scratch / "sim.log", replicas=args.workers,
                                          profile=args.profile, extra=["--kv-events-port", str(self.kv),
                                                                       "--max-num-seqs", str(args.max_num_seqs)])]
            for p in self.ports:
                procs.wait_ok(f"http://127.0.0.1:{p}", self.fleet[0])
        keys = scratch / "keys.yaml"
        keys.write_text(yaml.safe_dump([
            {"id": t, "key": key(t), "weight": w, "max_priority": "interactive"} for t, w in TENANTS.items()]
            + [{"id": "ui", "key": key("ui"), "max_priority": "interactive"},
               {"id": "etl", "key": key("etl"), "priority": "batch"}]))
        self.keys = keys

    def close(self) -> None:
        for proc in self.fleet:
            procs.stop(proc)

    def _workers(self) -> list[str]:
        if self.args.vllm:
            # Records that carry the capacity, as `sluice worker --gateway` registers it: a static vLLM worker
            # says its max_num_seqs only with VLLM_SERVER_DEV_MODE=1, else it counts as 256 and nothing queues
            # in the gateway.
            path = self.scratch / "vllm-workers.yaml"
            path.write_text(yaml.safe_dump([
                {"name": f"vllm-{i}", "url": f"http://127.0.0.1:{p}", "engine": "vllm", "models": [procs.MODEL],
                 "capacity": self.args.max_num_seqs} for i, p in enumerate(self.ports)]))
            return ["--workers-file", str(path)]
        return ["--workers-file", str(procs.workers_file(self.scratch / "workers.yaml", self.ports, self.kv))]

    async def run(self, name: str, scenario: Callable[[Target, float], Awaitable[None]], *extra: str,
                  router: bool = False) -> tuple[Target, str]:
        """Start a gateway (Sluice with `extra` flags, or vllm-router), run `scenario`, stop it; returns the
        target with its requests, and the gateway's /metrics at the end (Sluice)."""
        port = procs.free_ports(1)[0]
        log = self.scratch / f"{name}.log"
        if router:
            gw = procs.vllm_router(port, [f"http://127.0.0.1:{p}" for p in self.ports], "cache_aware", log)
        else:
            gw = procs.spawn([sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--http-port",
                              str(port), "--grpc-port", "0", "--model-repository",
                              str(procs.gateway_repository(self.scratch)), *self._workers(), "--log-level",
                              "warning", "--api-keys-file", str(self.keys), *extra], log)
        try:
            procs.wait_ok(f"http://127.0.0.1:{port}", gw, timeout_s=180)
            await asyncio.sleep(1.0)
            target = Target(name, port, keyed=not router)
            await scenario(target, time.perf_counter())
            metrics = ""
            if not router:
                async with httpx.AsyncClient() as http:
                    metrics = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
            return target, metrics
        except Exception:
            procs.tail_logs(self.scratch)
            raise
        finally:
            procs.stop(gw)
            await asyncio.sleep(1.0)
