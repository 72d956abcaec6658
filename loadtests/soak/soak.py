"""Soak: N concurrent streaming chat clients for M minutes, some leaving mid-stream.

Each client sends streamed `/v1/chat/completions` one after another (closed loop). With
probability `--disconnect-rate` a request is abandoned after a random number of events (the
client closes the connection, which must abort the engine request). Every request ends in
exactly one outcome:

- `completed`: the stream ended with `data: [DONE]` and no error event;
- `error`: answered with an error (an HTTP status other than 200, or an in-band error event
  before `[DONE]`), counted by kind;
- `disconnected`: the client left on purpose;
- `lost`: sent but never answered (connection refused or reset, or a stream that ended
  without `[DONE]`);
- `hung`: no byte (not even an SSE ping) for `--hang-s`;
- `unfinished_at_drain`: still receiving bytes when the drain ended (a slow server, not a
  silent one: reported, but neither lost nor hung).

The server's RSS (`VmRSS` of /proc/<pid>/status) and the number of requests in flight are
sampled every `--sample-s`. Growth is measured from a warm baseline: the first sample after
`--warmup-minutes` (the first minute by default: weights paged in, allocator pools grown,
batch shapes seen), to the last sample before the deadline.

At the deadline no new request starts; requests in flight get `--drain-s` to finish. The run
then writes a JSON report and a PNG (RSS and in-flight over time) next to it, and exits 1 if any
request was lost or hung, if the server died, or if RSS grew more than `--max-rss-growth-pct`.

    .venv/bin/python loadtests/soak/soak.py --streams 64 --minutes 10 --disconnect-rate 0.1 \\
        --max-tokens 48 --out loadtests/reports/soak.json

Without `--url` it starts `sluice serve` with the default LLM (a temporary repository holding
only smollm2-135m-instruct) on a free loopback port, and stops it at the end. With `--url`,
pass `--server-pid` to sample that server's RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.servers import LLM_NAME, Server, llm_only_repository, start_server

PROMPTS = ["What is the capital of France?", "Name three primary colours.", "Write a haiku about rivers.",
           "Explain what a sluice gate does.", "List four planets.", "What is 12 times 7?",
           "Give one tip for learning to cook.", "Why is the sky blue?", "Count from one to ten.",
           "Describe a cat in one sentence."]
OUTCOMES = ("completed", "error", "disconnected", "lost", "hung", "unfinished_at_drain")


@dataclass(slots=True)
class Tally:
    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # by kind: http_503, event:<code>, lost:<why>
    in_flight: int = 0
    ttft_s: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Sample:
    t_s: float  # since the start of the load
    rss_kib: int | None
    in_flight: int


def read_rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


async def one_request(client: httpx.AsyncClient, url: str, args: argparse.Namespace, rng: random.Random,
                      tally: Tally) -> None:
    leave_after = rng.randint(1, max(1, args.max_tokens // 2)) if rng.random() < args.disconnect_rate else None
    body = {"model": args.model, "stream": True, "max_tokens": args.max_tokens, "temperature": 0.8,
            "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}
    tally.sent += 1
    tally.in_flight += 1
    t0 = time.monotonic()
    try:
        tally.outcomes[await _stream(client, url, body, leave_after, tally, t0)] += 1
    except asyncio.CancelledError:  # the drain ended; every read before it got a byte within hang_s
        tally.outcomes["unfinished_at_drain"] += 1
        raise
    finally:
        tally.in_flight -= 1


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], leave_after: int | None,
                  tally: Tally, t0: float) -> str:
    events = 0
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                tally.errors[f"http_{resp.status_code}"] += 1
                return "error"
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue  # SSE pings and blank separators
                data = line[5:].strip()
                if data == "[DONE]":
                    return "completed"
                event = json.loads(data)
                if "error" in event:
                    tally.errors[f"event:{event['error'].get('code') or event['error'].get('type')}"] += 1
                    return "error"
                if events == 0:
                    tally.ttft_s.append(time.monotonic() - t0)
                events += 1
                if leave_after is not None and events >= leave_after:
                    return "disconnected"  # leaving the block closes the connection mid-stream
        tally.errors["lost:stream ended without [DONE]"] += 1
        return "lost"
    except (httpx.ReadTimeout, httpx.ConnectTimeout, httpx.WriteTimeout, httpx.PoolTimeout) as exc:
        tally.errors[f"hung:{type(exc).__name__}"] += 1
        return "hung"
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: an event that is not JSON
        tally.errors[f"lost:{type(exc).__name__}"] += 1
        return "lost"


async def client_loop(client: httpx.AsyncClient, url: str, args: argparse.Namespace, seed: int,
                      deadline: float, tally: Tally) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        await one_request(client, url, args, rng, tally)


async def sampler(pid: int | None, tally: Tally, t0: float, every_s: float, samples: list[Sample]) -> None:
    while True:
        samples.append(Sample(round(time.monotonic() - t0, 1), read_rss_kib(pid) if pid else None, tally.in_flight))
        await asyncio.sleep(every_s)


async def run_load(url: str, pid: int | None, args: argparse.Namespace) -> tuple[Tally, list[Sample], float]:
    tally = Tally()
    samples: list[Sample] = []
    timeout = httpx.Timeout(args.hang_s)  # no byte for hang_s, on connect or on read: hung
    limits = httpx.Limits(max_connections=args.streams + 8, max_keepalive_connections=args.streams + 8)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t0 = time.monotonic()
        deadline = t0 + args.minutes * 60
        sample_task = asyncio.create_task(sampler(pid, tally, t0, args.sample_s, samples))
        clients = [asyncio.create_task(client_loop(client, url, args, args.seed + i, deadline, tally))
                   for i in range(args.streams)]
        _, pending = await asyncio.wait(clients, timeout=deadline - time.monotonic() + args.drain_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        drained_s = time.monotonic() - deadline
        sample_task.cancel()
        await asyncio.gather(sample_task, return_exceptions=True)
    samples.append(Sample(round(time.monotonic() - t0, 1), read_rss_kib(pid) if pid else None, tally.in_flight))
    return tally, samples, drained_s


def rss_summary(samples: list[Sample], load_s: float, warmup_s: float) -> dict[str, Any]:
    during = [s for s in samples if s.rss_kib is not None and s.t_s <= load_s]
    if not during:
        return {"measured": False}
    warm = [s for s in during if s.t_s >= warmup_s] or during[-1:]
    base, end = warm[0], warm[-1]
    assert base.rss_kib is not None and end.rss_kib is not None
    return {
        "measured": True, "start_kib": during[0].rss_kib, "warm_baseline_kib": base.rss_kib,
        "warm_baseline_at_s": base.t_s, "end_kib": end.rss_kib, "end_at_s": end.t_s,
        "peak_kib": max(s.rss_kib for s in during if s.rss_kib is not None),
        "after_drain_kib": samples[-1].rss_kib,
        "growth_pct": round(100.0 * (end.rss_kib - base.rss_kib) / base.rss_kib, 2),
        "growth_measured_from": f"the first sample at or after {warmup_s:.0f}s of load (warm baseline) "
                                "to the last sample before the deadline",
    }


def plot(samples: list[Sample], load_s: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    t = [s.t_s / 60 for s in samples]
    if any(s.rss_kib is not None for s in samples):
        ax.plot(t, [s.rss_kib / 1024 if s.rss_kib else float("nan") for s in samples], color="tab:blue")
    ax.set_xlabel("minutes")
    ax.set_ylabel("server RSS (MiB)", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(t, [s.in_flight for s in samples], color="tab:orange", alpha=0.7)
    ax2.set_ylabel("requests in flight", color="tab:orange")
    ax.axvline(load_s / 60, color="grey", linestyle="--", linewidth=1)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(args: argparse.Namespace, tally: Tally, samples: list[Sample], drained_s: float,
           server_alive: bool) -> dict[str, Any]:
    load_s = args.minutes * 60
    ttft = sorted(tally.ttft_s)
    rss = rss_summary(samples, load_s, min(args.warmup_minutes * 60, load_s / 3))
    lost, hung = tally.outcomes["lost"], tally.outcomes["hung"]
    answered = sum(tally.outcomes[o] for o in OUTCOMES)
    failed_growth = (args.max_rss_growth_pct is not None and rss.get("measured")
                     and rss["growth_pct"] > args.max_rss_growth_pct)
    return {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "loadavg_end": os.getloadavg()},
        "sent": tally.sent, "accounted": answered,
        **{o: tally.outcomes[o] for o in OUTCOMES},
        "errors_by_kind": dict(tally.errors),
        "ttft_s": {"p50": ttft[len(ttft) // 2], "p99": ttft[int(len(ttft) * 0.99)]} if ttft else None,
        "completed_per_s": round(tally.outcomes["completed"] / load_s, 2),
        "drain_s": round(drained_s, 1), "server_alive_and_healthy": server_alive, "rss": rss,
        "passed": lost == 0 and hung == 0 and server_alive and answered == tally.sent and not failed_growth,
        "samples": [asdict(s) for s in samples],
    }


def healthy(url: str, pid: int | None) -> bool:
    if pid is not None and read_rss_kib(pid) is None:
        return False
    try:
        return httpx.get(url + "/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=64, help="concurrent streaming clients")
    p.add_argument("--minutes", type=float, default=10.0, help="how long new requests start")
    p.add_argument("--disconnect-rate", type=float, default=0.1, help="share of requests abandoned mid-stream")
    p.add_argument("--url", help="an existing server; default: start sluice serve with the default LLM")
    p.add_argument("--server-pid", type=int, help="with --url: the server process whose RSS to sample")
    p.add_argument("--model", default=LLM_NAME)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--hang-s", type=float, default=30.0, help="no byte for this long: the request hung")
    p.add_argument("--drain-s", type=float, default=60.0, help="time in-flight requests get after the deadline")
    p.add_argument("--sample-s", type=float, default=2.0, help="RSS and in-flight sampling period")
    p.add_argument("--warmup-minutes", type=float, default=1.0, help="where the warm RSS baseline is taken")
    p.add_argument("--max-rss-growth-pct", type=float, help="fail when RSS grows more than this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "loadtests" / "reports" / "soak.json")
    args = p.parse_args(argv)
    if args.streams < 1 or args.minutes <= 0 or not 0 <= args.disconnect_rate <= 1:
        p.error("--streams must be >= 1, --minutes > 0 and --disconnect-rate in [0, 1]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server: Server | None = None
    with tempfile.TemporaryDirectory(prefix="sluice-soak-") as scratch:
        if args.url is None:
            repo = llm_only_repository(Path(scratch))
            server = start_server(["--model-repository", str(repo)], Path(scratch) / "server.log")
        url = args.url or (server.url if server else "")
        pid = server.proc.pid if server else args.server_pid
        try:
            tally, samples, drained_s = asyncio.run(run_load(url, pid, args))
            alive = healthy(url, pid)
        finally:
            if server is not None:
                server.stop()
    result = report(args, tally, samples, drained_s, alive)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(samples, args.minutes * 60, args.out.with_suffix(".png"),
         f"soak: {args.streams} streams, {args.minutes:g} min, disconnect rate {args.disconnect_rate:g}")
    summary = {k: result[k] for k in ("sent", *OUTCOMES, "errors_by_kind", "passed")}
    print(json.dumps({**summary, "rss_growth_pct": result["rss"].get("growth_pct")}))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
