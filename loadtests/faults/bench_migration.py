"""Streams that survive their worker: a third of the sim workers SIGKILLed while 200 streams run.

`--workers` sim workers (`sluice worker --engine sim`, one process each, every engine step
`--step-s` long) behind `sluice serve --workers-file`. `--streams` streamed chats (greedy,
`ignore_eos`, `max_tokens` each) start at once; while they run, `--kill` workers chosen at random
get SIGKILL, each once the streams as a whole have read a random 15 to 60 % of their tokens, so the
kills land mid-answer at random points. Each scenario runs twice on a fresh fleet, side by side:

- `migrate`: the gateway's defaults (`--max-migrations 3`): a stream whose worker dies resumes on
  another worker from the tokens it had, and the client sees one stream;
- `no_migration`: `--max-migrations 0`, the behaviour before streams could move: such a stream
  ends with an error event.

Per scenario: streams that completed (one id, no error event, `[DONE]`, `finish_reason` length,
`usage.completion_tokens` exactly `max_tokens`), streams that ended otherwise, and the pause each
client saw: the longest gap between two content events of a stream whose first-ranked worker was
killed, against the same gap of the streams whose worker lived (p50, p99, max). The gateway's own
`sluice_llm_migrations_total` by outcome and `sluice_llm_migration_pause_seconds` are read from
/metrics. Exits 1 unless every stream of `migrate` completed.

    .venv/bin/python loadtests/faults/bench_migration.py [--streams 200] [--workers 6] [--kill 2]

Writes loadtests/reports/migration.json. `run_scenario` is what the integration test runs
(tests/integration/test_migration_sim.py).
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
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadtests.faults.bench_worker_faults import Fleet
from loadtests.lib import procs
from loadtests.lib.stats import percentile
from tests.servers import metric_value

REPORT = ROOT / "loadtests" / "reports" / "migration.json"
RUN_WAIT_S = 600.0  # the whole scenario, every stream to its end


@dataclass
class Stream:
    """One streamed chat, read to its end."""

    index: int
    worker: str = ""
    status: int = 0
    ids: set[str] = field(default_factory=set)
    content_at: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int | None = None
    error: dict[str, Any] | None = None
    done: bool = False
    failure: str | None = None

    def complete(self, max_tokens: int) -> bool:
        return (self.status == 200 and self.done and self.error is None and self.failure is None
                and len(self.ids) == 1 and self.finish_reason == "length"
                and self.completion_tokens == max_tokens and bool("".join(self.text)))

    def longest_gap_s(self) -> float:
        t = self.content_at
        return max((b - a for a, b in pairwise(t)), default=0.0)


def _take(s: Stream, payload: str) -> None:
    if payload == "[DONE]":
        s.done = True
        return
    event = json.loads(payload)
    if "error" in event:
        s.error = event["error"]
        return
    s.ids.add(event.get("id", ""))
    if event.get("usage"):
        s.completion_tokens = event["usage"].get("completion_tokens")
    for choice in event.get("choices") or []:
        content = (choice.get("delta") or {}).get("content")
        if content:
            s.content_at.append(time.monotonic())
            s.text.append(content)
        if choice.get("finish_reason"):
            s.finish_reason = choice["finish_reason"]


async def read_stream(http: httpx.AsyncClient, s: Stream, max_tokens: int, progress: list[int]) -> None:
    body = {"model": procs.MODEL, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"stream {s.index}: tell me a long story"}]}
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            s.status, s.worker = r.status_code, r.headers.get("x-sluice-worker", "")
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    before = len(s.content_at)
                    _take(s, line[6:])
                    progress[0] += len(s.content_at) - before
    except httpx.HTTPError as exc:
        s.failure = type(exc).__name__


async def killer(fleet: Fleet, victims: list[str], progress: list[int], total: int, rng: random.Random,
                 kills: list[dict[str, Any]]) -> None:
    """SIGKILL each victim once the streams as a whole have read a random share of their tokens."""
    marks = sorted(rng.uniform(0.15, 0.6) for _ in victims)
    for name, mark in zip(victims, marks, strict=True):
        while progress[0] < mark * total:  # noqa: ASYNC110 (a share of tokens read: polled, 20 ms)
            await asyncio.sleep(0.02)
        fleet.kill(name)
        kills.append({"worker": name, "at_share": round(progress[0] / total, 3)})


async def _metrics(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        text = (await http.get("/metrics")).text
    outcomes: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("sluice_llm_migrations_total{"):
            labels = {k: v.strip('"') for k, v in (kv.split("=", 1) for kv in
                                                   line[line.index("{") + 1:line.index("}")].split(","))}
            key = f"{labels['cause']}:{labels['outcome']}"
            outcomes[key] = outcomes.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    cut: dict[str, float] = {}  # connections the gateway closed on a client, by reason (none expected)
    for line in text.splitlines():
        if line.startswith(("sluice_http_connections_closed_total{", "sluice_stream_slow_reader_total{")):
            cut[line[line.index("{") + 1:line.index("}")]] = float(line.rsplit(" ", 1)[1])
    count = metric_value(text, "sluice_llm_migration_pause_seconds_count", {"model": procs.MODEL}) or 0.0
    total = metric_value(text, "sluice_llm_migration_pause_seconds_sum", {"model": procs.MODEL}) or 0.0
    return {"migrations": outcomes, "pause_s_mean": round(total / count, 4) if count else None,
            "pauses_counted": count, "client_connections_cut": cut}


def _gaps(values: list[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99), "max": max(values, default=None),
            "n": len(values)}


async def run_scenario(scratch: Path, *, workers: int, streams: int, kill: int, max_tokens: int, step_s: float,
                       migrate: bool, seed: int = 0) -> dict[str, Any]:
    """One scenario on a fresh fleet; returns its summary and per-stream rows."""
    rng = random.Random(seed)
    fleet = Fleet(scratch, step_s, workers, None if migrate else ["--max-migrations", "0"])
    try:
        progress, kills = [0], []
        async with httpx.AsyncClient(base_url=fleet.gateway_url, timeout=RUN_WAIT_S,
                                     limits=httpx.Limits(max_connections=streams + 8)) as http:
            await http.post("/v1/chat/completions", json={"model": procs.MODEL, "max_tokens": 1,
                                                          "messages": [{"role": "user", "content": "warm up"}]})
            rows = [Stream(i) for i in range(streams)]
            tasks = [asyncio.create_task(read_stream(http, s, max_tokens, progress)) for s in rows]
            victims = rng.sample(sorted(fleet.workers), kill)
            murder = asyncio.create_task(killer(fleet, victims, progress, streams * max_tokens, rng, kills))
            await asyncio.wait_for(asyncio.gather(*tasks), RUN_WAIT_S)
            murder.cancel()
            await asyncio.gather(murder, return_exceptions=True)
        gateway = await _metrics(fleet.gateway_url)
    finally:
        fleet.stop()
    killed = {k["worker"] for k in kills}
    hit = [s for s in rows if s.worker in killed]
    spared = [s for s in rows if s.worker not in killed]
    completed = [s.complete(max_tokens) for s in rows]
    endings: dict[str, int] = {}
    for s, ok in zip(rows, completed, strict=True):
        key = "completed" if ok else (f"error: {s.error.get('code') or s.error.get('type')}" if s.error
                                      else s.failure or f"finish {s.finish_reason}, {s.completion_tokens} tokens")
        endings[key] = endings.get(key, 0) + 1
    return {"migrate": migrate, "streams": streams, "completed": sum(completed), "endings": endings,
            "kills": kills, "streams_on_killed_workers": len(hit),
            "pause_s_streams_on_killed_workers": _gaps([s.longest_gap_s() for s in hit]),
            "pause_s_other_streams": _gaps([s.longest_gap_s() for s in spared]),
            "gateway": gateway}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("--kill", type=int, default=2, help="workers killed mid-run (a third by default)")
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--step-s", type=float, default=0.03, help="the sim's time per engine step (one token)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPORT)
    args = p.parse_args()
    if not 1 <= args.kill < args.workers or args.streams < 1 or args.max_tokens < 8:
        p.error("need 1 <= --kill < --workers, --streams >= 1, --max-tokens >= 8")
    return args


def main() -> int:
    args = parse_args()
    started, load_at_start = time.monotonic(), os.getloadavg()[0]
    scenarios = {}
    for name, migrate in (("migrate", True), ("no_migration", False)):
        with tempfile.TemporaryDirectory(prefix=f"sluice-migration-{name}-") as tmp:
            try:
                scenarios[name] = asyncio.run(run_scenario(
                    Path(tmp), workers=args.workers, streams=args.streams, kill=args.kill,
                    max_tokens=args.max_tokens, step_s=args.step_s, migrate=migrate, seed=args.seed))
            except BaseException:
                procs.tail_logs(Path(tmp))
                raise
        print(name, json.dumps({k: v for k, v in scenarios[name].items() if k != "kills"}), flush=True)
    report = {"benchmark": "a third of the sim workers SIGKILLed while streams run: streams that complete, "
                           "and the pause their clients saw; with migration (defaults) and without",
              "settings": {"workers": args.workers, "killed": args.kill, "streams": args.streams,
                           "max_tokens": args.max_tokens, "engine": "sim", "profile": f"base_s={args.step_s}",
                           "model": procs.MODEL, "client": "httpx, the time a line is read",
                           "request": "chat, temperature 0, ignore_eos, stream with usage"},
              "scenarios": scenarios,
              "passed": scenarios["migrate"]["completed"] == args.streams,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_avg_1m_at_start": round(load_at_start, 2),
                          "load_avg_1m_at_end": round(os.getloadavg()[0], 2)},
              "elapsed_s": round(time.monotonic() - started, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
