"""Live routing experiments: a sim fleet behind `sluice serve` and behind vllm-router, same run.

For each fleet size (`--workers 8,16`): one `sluice worker --engine sim --replicas N` process
with a calibrated profile (default `vllm-cpu-smollm2-135m`: vLLM on these CPUs), and one
`sluice serve` in front of it (`--workers-file`, KV events on). For each workload and rate
(`loadtests/routing/live_workloads.py`), every policy runs the same requests in turn (order rotated):
Sluice's `prefix`, `least_load` and `round_robin` (through `X-Routing-Policy`), and vllm-router's
`cache_aware` and `round_robin` (a fresh vllm-router per run, in front of the same workers).
Each run's prompts start with two words of its own (a run tag), so it starts from cold engine
caches and no run reuses another's blocks, whatever the router forwards; the fleet is idle
between runs.

Open loop: each request is sent at its arrival time, streamed, and its TTFT and usage
(`prompt_tokens_details.cached_tokens`) read. Per run: engine-reported hit rate (usage, and the
workers' `vllm:prefix_cache_*` counters), the upper bound (one infinite-cache worker seeing every
request), TTFT p50/p99, goodput (requests/s with TTFT within `--slo-ttft-s`), and load imbalance
(max over mean of per-worker uncached prompt tokens, from the workers' counters).

    flock /tmp/sluice-bench.lock .venv/bin/python loadtests/routing/bench_live.py        # everything
    ... --workers 8 --workloads chat,mooncake --duration-s 30                               # a subset
    ... --workers 64 --workloads nosharing,skewed --levels high --out ...                   # some cells

JSON in loadtests/reports/live_routing.json, PNG next to it. Rerun after a routing change with the
same command: the workloads are seeded, so the traffic is the same.
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
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadtests.lib import procs
from loadtests.lib.stream_client import StreamConn
from loadtests.routing.live_stats import Outcome, summarize, upper_bound, worker_counters
from loadtests.routing.live_workloads import WORKLOADS, Request, Vocab

REPORT = ROOT / "loadtests" / "reports" / "live_routing.json"
SLUICE_POLICIES = ("prefix", "least_load", "round_robin")
VLLM_POLICIES = ("cache_aware", "round_robin")
# Requests/s at 8 workers (low, high); scaled with the fleet. Set for the smollm2 profile (a cold
# 1k-token prefill takes about 1.2 s, a warm one about 0.15 s): low leaves headroom, high queues.
RATES = {"chat": (3.0, 8.0), "skewed": (3.0, 8.0), "agentic": (3.0, 8.0), "docqa": (1.5, 4.0),
         "nosharing": (2.0, 5.0), "mooncake": (2.0, 5.0)}
REQUEST_TIMEOUT_S = 90.0


def build_workload(name: str, vocab: Vocab, rate: float, duration_s: float, seed: int) -> list[Request]:
    return WORKLOADS[name](vocab, rate, duration_s, seed)


def token_ids(tokenizer: Any, reqs: list[Request]) -> list[list[int]]:
    """The prompts as the engine sees them (the model's chat template; text prompts as the sim encodes them)."""
    return [tokenizer.render_chat(list(r.messages)) if r.messages is not None else tokenizer.encode(r.prompt)
            for r in reqs]


def tagged(r: Request, tag: str) -> Request:
    """`r` with `tag` (two words) in front of its text: a run of its own, whose blocks no other run
    made. (A router that forwarded `cache_salt` would not need it; the tag works for any router.)"""
    if r.messages is not None:
        first = dict(r.messages[0], content=tag + r.messages[0]["content"])
        return replace(r, messages=(first, *r.messages[1:]))
    return replace(r, prompt=tag + (r.prompt or ""))


async def send_all(port: int, reqs: list[Request], policy_header: str | None) -> list[Outcome]:
    """Open loop: request i is sent at its arrival time on its own connection."""
    t0 = time.perf_counter() + 0.2

    async def one(r: Request) -> Outcome:
        await asyncio.sleep(max(0.0, t0 + r.arrival_s - time.perf_counter()))
        body: dict[str, Any] = {"model": procs.MODEL, "max_tokens": r.max_tokens, "stream": True, "ignore_eos": True,
                                "temperature": 0, "stream_options": {"include_usage": True}}
        if r.messages is not None:
            path, body["messages"] = "/v1/chat/completions", list(r.messages)
        else:
            path, body["prompt"] = "/v1/completions", r.prompt
        headers = {"X-Routing-Policy": policy_header, "X-Session-Id": r.session} if policy_header else {}
        conn = StreamConn("127.0.0.1", port)
        try:
            res = await asyncio.wait_for(conn.post_stream(path, body, headers), REQUEST_TIMEOUT_S)
        except (TimeoutError, OSError, ValueError) as e:
            return Outcome(False, None, 0, 0, f"{type(e).__name__}: {e}")
        finally:
            await conn.close()
        ok = res.status == 200 and res.done and not res.error
        return Outcome(ok, res.ttft_s, res.prompt_tokens, res.cached_tokens or 0, res.error or
                       (None if ok else f"status {res.status}"))

    return list(await asyncio.gather(*(one(r) for r in reqs)))


async def scrape(urls: list[str]) -> dict[str, dict[str, float]]:
    async with httpx.AsyncClient(timeout=10) as client:
        texts = await asyncio.gather(*(client.get(u + "/metrics") for u in urls))
    return {u: worker_counters(t.text) for u, t in zip(urls, texts, strict=True)}


async def wait_idle(urls: list[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() < deadline:
            texts = await asyncio.gather(*(client.get(u + "/metrics") for u in urls))
            busy = sum(float(line.rsplit(" ", 1)[1]) for t in texts for line in t.text.splitlines()
                       if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")))
            if busy == 0:
                return
            await asyncio.sleep(0.5)


async def start_vllm_router(worker_urls: list[str], policy: str, log: Path) -> tuple[int, Any]:
    """A fresh vllm-router; on a shared machine a port picked free can be taken before it binds, so
    a router that exits at start is started again on other ports (three tries)."""
    for attempt in range(3):
        port = procs.free_ports(1)[0]
        router = procs.vllm_router(port, worker_urls, policy, log.with_suffix(f".{attempt}.log"))
        try:
            await asyncio.to_thread(procs.wait_ok, f"http://127.0.0.1:{port}", router)
            return port, router
        except RuntimeError:
            procs.stop(router)
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


async def run_policy(policy: str, gateway_port: int, worker_urls: list[str], reqs: list[Request], run: str,
                     scratch: Path, duration_s: float, slo_ttft_s: float) -> dict[str, Any]:
    """One policy's run; vllm-router ones start their own router and stop it after."""
    await wait_idle(worker_urls)
    router = None
    if policy.startswith("vllm:"):
        port, router = await start_vllm_router(worker_urls, policy.split(":", 1)[1], scratch / f"vr-{run}.log")
        header = None
    else:
        port, header = gateway_port, policy.split(":", 1)[1]
    try:
        before = await scrape(worker_urls)
        load1 = os.getloadavg()[0]
        t0 = time.perf_counter()
        outcomes = await send_all(port, reqs, header)
        wall_s = time.perf_counter() - t0
        await wait_idle(worker_urls, 30.0)
        after = await scrape(worker_urls)
    finally:
        if router is not None:
            procs.stop(router)
    row = summarize(outcomes, max(duration_s, 1e-9), slo_ttft_s, before, after)
    row.update({"policy": policy, "wall_s": round(wall_s, 2), "loadavg_1m": round(load1, 2)})
    return row


async def run_fleet(n: int, args: argparse.Namespace, vocab: Vocab, tokenizer: Any, scratch: Path,
                    results: list[dict[str, Any]]) -> None:
    """Start an N-worker fleet and its gateway, run every workload × rate × policy on it, stop them."""
    base, kv, gw = procs.free_ports(3, span=2 * n + 2)
    block = args.block_size
    extra = ["--kv-events-port", str(kv), "--block-size", str(block), "--max-model-len", "8192",
             "--num-gpu-blocks", str(args.kv_tokens // block)]
    fleet = procs.sim_fleet(base, scratch / f"fleet{n}.log", replicas=n, profile=args.profile, extra=extra)
    group = [fleet]
    try:
        urls = [f"http://127.0.0.1:{base + i}" for i in range(n)]
        for u in urls:
            await asyncio.to_thread(procs.wait_ok, u, fleet)
        wf = procs.workers_file(scratch / f"workers{n}.yaml", [base + i for i in range(n)], kv, block_size=block)
        group.append(procs.sluice(gw, wf, scratch / f"sluice{n}.log"))
        await asyncio.to_thread(procs.wait_ok, f"http://127.0.0.1:{gw}", group[-1])
        policies = [p for p in [f"sluice:{p}" for p in SLUICE_POLICIES] + [f"vllm:{p}" for p in VLLM_POLICIES]
                    if p in args.policies]
        tag_rng = random.Random(time.time_ns())  # run tags differ from any earlier run's
        for w_i, name in enumerate(args.workloads):
            if name == "mooncake" and n not in args.mooncake_workers:
                continue
            for level, base_rate in zip(("low", "high"), RATES[name], strict=True):
                if level not in args.levels:
                    continue
                rate = base_rate * n / 8
                reqs = build_workload(name, vocab, rate, args.duration_s, args.seed)
                bound = upper_bound(token_ids(tokenizer, [tagged(r, vocab.words[0] * 2) for r in reqs]), block)
                k = (w_i + (level == "high")) % len(policies)
                for policy in policies[k:] + policies[:k]:
                    tag = vocab.text(tag_rng, 2)
                    run = f"{name}-{level}-{n}-{policy.replace(':', '-')}"
                    row = await run_policy(policy, gw, urls, [tagged(r, tag) for r in reqs], run, scratch,
                                           args.duration_s, args.slo_ttft_s)
                    row.update({"workers": n, "workload": name, "rate_level": level, "rate_rps": rate,
                                "upper_bound_hit_rate": bound})
                    results.append(row)
                    print(f"N={n:<3} {name:<9} {level:<4} {rate:5.1f}/s {policy:<18} hit "
                          f"{row['hit_rate_usage'] or 0:.2f} (bound {bound:.2f}) ttft p50 "
                          f"{row['ttft_p50_s'] or 0:.2f} p99 {row['ttft_p99_s'] or 0:.2f} s good "
                          f"{row['goodput_rps']:.2f}/s imb {row['imbalance_uncached_prefill'] or 0:.2f} "
                          f"fail {row['failed']} load {row['loadavg_1m']}", flush=True)
    finally:
        for proc in reversed(group):
            procs.stop(proc)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="8,16")
    p.add_argument("--workloads", default="chat,docqa,agentic,skewed,nosharing,mooncake")
    p.add_argument("--mooncake-workers", default="8", help="fleet sizes the Mooncake replay runs at")
    p.add_argument("--duration-s", type=float, default=20.0, help="arrivals per run span this long")
    p.add_argument("--profile", default="vllm-cpu-smollm2-135m")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--kv-tokens", type=int, default=46592, help="KV capacity per worker in tokens (the profile's)")
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--levels", default="low,high", help="rate levels to run (a rerun of some cells: high)")
    p.add_argument("--policies", default=",".join([f"sluice:{p}" for p in SLUICE_POLICIES] +
                                                  [f"vllm:{p}" for p in VLLM_POLICIES]))
    p.add_argument("--out", type=Path, default=REPORT)
    args = p.parse_args()
    args.workloads = args.workloads.split(",")
    args.mooncake_workers = [int(x) for x in args.mooncake_workers.split(",")]
    args.levels, args.policies = args.levels.split(","), args.policies.split(",")
    from engines.text.tokenizer import ChatTokenizer
    from engines.weights import resolve_llm

    tokenizer = ChatTokenizer(resolve_llm(procs.MODEL, ROOT / "model_repository"))
    vocab = Vocab.from_tokenizer(tokenizer._tok)
    results: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-live-") as tmp:
        scratch = Path(tmp)
        try:
            for n in [int(x) for x in args.workers.split(",")]:
                asyncio.run(run_fleet(n, args, vocab, tokenizer, scratch, results))
        except Exception:
            procs.tail_logs(scratch)
            raise
        finally:
            write_report(args, results, vocab.check(tokenizer._tok), time.monotonic() - t0)
    return 0


def write_report(args: argparse.Namespace, results: list[dict[str, Any]], vocab_ok: float, total_s: float) -> None:
    report = {"benchmark": "live routing: sim fleet behind sluice serve and vllm-router, same workloads",
              "profile": args.profile, "block_size": args.block_size, "kv_tokens_per_worker": args.kv_tokens,
              "duration_s": args.duration_s, "slo_ttft_s": args.slo_ttft_s, "seed": args.seed,
              "rates_at_8_workers": RATES, "vllm_router": "vllm-router 0.1.17, a fresh process per run",
              "hit_rate": "engine-reported: usage cached_tokens / prompt_tokens over the run's requests",
              "imbalance": "max over mean, per worker, of uncached prompt tokens (workers' counters)",
              "vocab_round_trip": vocab_ok, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                        "loadavg_at_end": os.getloadavg()},
              "total_s": round(total_s, 1), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    if results:
        from loadtests.routing.live_plot import plot

        plot(report, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
