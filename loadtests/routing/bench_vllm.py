"""Prefix-affinity routing vs round-robin vs least-load over two real vLLM workers.

Starts two vLLM workers through the launcher (the tiny random Llama the
integration tests use, or `--model smollm2-135m-instruct`) and one gateway in
front of them, then runs the same shared-prefix multi-turn chat workload once
per policy, the policy chosen per request with `X-Routing-Policy`. Each policy
gets its own system prompt (same length, different text), so no policy finds
blocks another one cached.

Workload: `--sessions` conversations start as a seeded Poisson process at
`--rate` conversations/s; each runs `--turns` turns in order (the assistant turn
is the model's own greedy answer). Every conversation opens with the policy's
shared system prompt (about `--prefix-tokens` tokens) plus its own opening
message (about `--session-tokens` tokens); later turns add a short question.

Reported per policy: the engines' prefix-cache hit rate (deltas of
`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` summed over
both workers), the share of prompt tokens the engines reported as cached
(`usage.prompt_tokens_details.cached_tokens`), TTFT p50/p95, request and output
token throughput, and requests per worker. JSON in loadtests/reports/routing.json,
a PNG next to it.

    .venv/bin/python loadtests/routing/bench_vllm.py            # tiny model, ~2-3 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.integration.vllm_support import free_port, free_port_pair, metric_value, stop_process, wait_healthy

REPORT = ROOT / "loadtests" / "reports" / "routing.json"
POLICIES = ("prefix", "round_robin", "least_load")
SERVED = "bench-llm"
WORDS = ["harbour", "tide", "cargo", "lantern", "ferry", "pier", "gull", "anchor", "rope", "mast", "sail", "compass",
         "chart", "reef", "beacon", "keel", "hull", "storm", "calm", "dawn", "dusk", "north", "south", "east", "west",
         "island", "current", "wave"]


def _spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Own process group (stop_process kills the group); output to a log shown on failure."""
    with open(log, "wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True, stdout=out,
                                stderr=subprocess.STDOUT)


def _text(seed: str, n_words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


async def _sized(client: httpx.AsyncClient, gateway: str, seed: str, tokens: int, role: str) -> str:
    """Text of about `tokens` tokens in the model's own tokenizer (grown until it fits)."""
    n = max(4, tokens)
    for _ in range(20):  # bounded
        text = _text(seed, n)
        r = await client.post(f"{gateway}/tokenize", json={
            "model": SERVED, "messages": [{"role": role, "content": text}], "add_generation_prompt": False})
        count = r.json()["count"]
        if abs(count - tokens) <= 8:
            return text
        n = max(4, int(n * tokens / max(count, 1)))
    return text


async def _turn(client: httpx.AsyncClient, gateway: str, policy: str, messages: list[dict[str, str]],
                max_tokens: int) -> tuple[dict[str, object], str]:
    body = {"model": SERVED, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft, usage, parts = None, {}, []
    async with client.stream("POST", f"{gateway}/v1/chat/completions", json=body,
                             headers={"X-Routing-Policy": policy}) as r:
        r.raise_for_status()
        worker = r.headers["x-sluice-worker"]
        predicted = int(r.headers.get("x-sluice-predicted-cached-tokens", "0"))
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices"):
                piece = chunk["choices"][0].get("delta", {}).get("content")
                if piece:
                    parts.append(piece)
                    if ttft is None:
                        ttft = time.perf_counter() - start
            if chunk.get("usage"):
                usage = chunk["usage"]
    total = time.perf_counter() - start
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    row = {"worker": worker, "ttft_s": ttft if ttft is not None else total, "prompt_tokens": usage["prompt_tokens"],
           "completion_tokens": usage["completion_tokens"], "cached_tokens": cached, "predicted_cached": predicted}
    return row, "".join(parts)


async def _session(client: httpx.AsyncClient, gateway: str, policy: str, system: str, opening: str, i: int,
                   delay_s: float, args: argparse.Namespace) -> list[dict[str, object]]:
    await asyncio.sleep(delay_s)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": opening}]
    rows = []
    for t in range(args.turns):
        row, answer = await _turn(client, gateway, policy, messages, args.max_tokens)
        rows.append({**row, "session": i, "turn": t})
        messages += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": f"Turn {t + 1}, session {i}: and then?"}]
    return rows


async def _engine_counters(client: httpx.AsyncClient, workers: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in workers:
        text = (await client.get(f"{url}/metrics")).text
        hits += metric_value(text, "vllm:prefix_cache_hits_total")
        queries += metric_value(text, "vllm:prefix_cache_queries_total")
    return hits, queries


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _run_policy(client: httpx.AsyncClient, gateway: str, workers: list[str], policy: str,
                      args: argparse.Namespace) -> dict[str, object]:
    system = await _sized(client, gateway, f"system-{policy}-{args.seed}", args.prefix_tokens, "system")
    openings = [await _sized(client, gateway, f"open-{policy}-{i}-{args.seed}", args.session_tokens, "user")
                for i in range(args.sessions)]
    rng = random.Random(args.seed)  # same arrival times for every policy
    delays, t = [], 0.0
    for _ in range(args.sessions):
        delays.append(t)
        t += rng.expovariate(args.rate)
    hits0, queries0 = await _engine_counters(client, workers)
    start = time.perf_counter()
    sessions = await asyncio.gather(*(_session(client, gateway, policy, system, openings[i], i, delays[i], args)
                                      for i in range(args.sessions)))
    wall = time.perf_counter() - start
    hits1, queries1 = await _engine_counters(client, workers)
    rows = [r for s in sessions for r in s]
    ttfts = [float(r["ttft_s"]) * 1000 for r in rows]
    prompt = sum(int(r["prompt_tokens"]) for r in rows)
    cached = sum(int(r["cached_tokens"]) for r in rows)
    per_worker: dict[str, int] = {}
    for r in rows:
        per_worker[str(r["worker"])] = per_worker.get(str(r["worker"]), 0) + 1
    within = sum(abs(int(r["predicted_cached"]) - int(r["cached_tokens"])) <= args.block for r in rows)
    out = {
        "policy": policy, "requests": len(rows), "wall_s": wall,
        "engine_prefix_cache_hit_rate": (hits1 - hits0) / (queries1 - queries0) if queries1 > queries0 else 0.0,
        "engine_prefix_cache_hits": hits1 - hits0, "engine_prefix_cache_queries": queries1 - queries0,
        "reported_cached_token_share": cached / prompt if prompt else 0.0,
        "ttft_p50_ms": statistics.median(ttfts), "ttft_p95_ms": _pct(ttfts, 0.95),
        "requests_per_s": len(rows) / wall,
        "output_tokens_per_s": sum(int(r["completion_tokens"]) for r in rows) / wall,
        "requests_per_worker": per_worker,
        "prediction_within_one_block": within / len(rows),
    }
    print(json.dumps(out), flush=True)
    return out


def _ratios(results: dict[str, dict[str, object]]) -> dict[str, dict[str, float]]:
    keys = ("engine_prefix_cache_hit_rate", "reported_cached_token_share", "ttft_p50_ms", "ttft_p95_ms",
            "requests_per_s", "output_tokens_per_s")
    base = results["prefix"]
    out = {}
    for other in ("round_robin", "least_load"):
        o = results[other]
        out[f"prefix_over_{other}"] = {k: float(base[k]) / float(o[k]) if float(o[k]) else float("inf")
                                       for k in keys}
    return out


def _plot(results: dict[str, dict[str, object]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    axes[0].bar(names, [results[n]["engine_prefix_cache_hit_rate"] for n in names])
    axes[0].set_ylabel("engine prefix-cache hit rate")
    axes[0].set_ylim(0, 1)
    p50 = [float(results[n]["ttft_p50_ms"]) for n in names]
    p95 = [float(results[n]["ttft_p95_ms"]) for n in names]
    axes[1].bar(names, p50)
    axes[1].errorbar(names, p50, yerr=[[0] * len(p50), [b - a for a, b in zip(p50, p95, strict=True)]], fmt="none",
                     ecolor="k", capsize=4)
    axes[1].set_ylabel("TTFT ms (bar p50, whisker p95)")
    axes[2].bar(names, [results[n]["output_tokens_per_s"] for n in names])
    axes[2].set_ylabel("output tokens/s")
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _start_workers(args: argparse.Namespace, scratch: Path, procs: list) -> list[str]:
    from engines.launchers import WorkerEnvironment
    from engines.launchers import vllm as vllm_launch
    from tests.integration.vllm_support import tiny_llama_dir

    python = vllm_launch.resolve_python(WorkerEnvironment.from_environ().vllm_python)
    model = str(tiny_llama_dir()) if args.model == "tiny-llama" else args.model
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", SLUICE_VLLM_PYTHON=python)
    urls = []
    for i in range(2):
        port, kv_port = free_port_pair(), free_port_pair()
        procs.append(_spawn([sys.executable, "-m", "engines.launchers", "--engine", "vllm", "--model", model,
                             "--served-model-name", SERVED, "--port", str(port), "--kv-events-port", str(kv_port),
                             "--max-model-len", "2048"], scratch / f"worker{i}.log", env))
        urls.append(f"http://127.0.0.1:{port}")
    for url, proc in zip(urls, procs, strict=True):
        wait_healthy(url, proc, timeout_s=600.0)
    return urls


def _start_gateway(args: argparse.Namespace, urls: list[str], scratch: Path, procs: list) -> str:
    import shutil

    from tests.integration.vllm_support import tiny_llama_dir

    repo = scratch / "repo"
    repo.mkdir()
    src = ROOT / "model_repository" / "smollm2-135m-instruct"
    shutil.copytree(src, repo / src.name)  # the tokenizer's source, found by `root` or the model name
    port = free_port()
    tok = str(tiny_llama_dir()) if args.model == "tiny-llama" else args.model
    workers_file = scratch / "workers.yaml"
    workers_file.write_text("".join(f"- {{name: vllm-{i}, url: '{u}', engine: vllm, tokenizer: '{tok}'}}\n"
                                    for i, u in enumerate(urls)))
    procs.append(_spawn([sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--http-port",
                         str(port), "--grpc-port", "0", "--model-repository", str(repo), "--workers-file",
                         str(workers_file)], scratch / "gateway.log"))
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, procs[-1], timeout_s=600.0)
    return url


async def _bench(gateway: str, workers: list[str], args: argparse.Namespace) -> dict[str, dict[str, object]]:
    async with httpx.AsyncClient(timeout=600) as client:
        results = {}
        for policy in POLICIES:
            results[policy] = await _run_policy(client, gateway, workers, policy, args)
        return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-llama", help="tiny-llama (the tests' model) or smollm2-135m-instruct")
    p.add_argument("--sessions", type=int, default=12)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--prefix-tokens", type=int, default=512, help="shared system prompt length")
    p.add_argument("--session-tokens", type=int, default=160, help="each conversation's own opening")
    p.add_argument("--rate", type=float, default=4.0, help="conversation arrivals per second (Poisson)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--block", type=int, default=128, help="engine KV block size, for the prediction check")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=REPORT)
    args = p.parse_args()
    for name in ("sessions", "turns", "prefix_tokens", "max_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.rate <= 0:
        p.error("--rate must be > 0")
    procs: list = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-routing-bench-") as tmp:
        scratch = Path(tmp)
        try:
            urls = _start_workers(args, scratch, procs)
            gateway = _start_gateway(args, urls, scratch, procs)
            time.sleep(2.0)  # first /metrics scrape and KV-event subscriptions
            results = asyncio.run(_bench(gateway, urls, args))
        except Exception:
            for log in sorted(scratch.glob("*.log")):
                print(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
        finally:
            for proc in reversed(procs):
                stop_process(proc, timeout_s=60.0)
    report = {
        "benchmark": "routing", "model": args.model, "workers": 2, "engine": "vllm-cpu",
        "workload": {k: getattr(args, k) for k in ("sessions", "turns", "prefix_tokens", "session_tokens",
                                                    "rate", "max_tokens", "seed")},
        "policies_in_order": list(POLICIES), "results": results, "ratios": _ratios(results),
        "elapsed_s": time.monotonic() - t0,
        "note": ("Each policy runs on its own system prompt, so no policy warms the cache for the next. "
                 "Same arrival times for every policy. Loopback, 2 shared CPU cores: absolute latencies are "
                 "machine-bound; compare policies."),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    _plot(results, args.out.with_suffix(".png"),
          f"{args.model}, 2 vLLM workers, {args.sessions} sessions x {args.turns} turns, "
          f"prefix {args.prefix_tokens} tok, {args.rate}/s")
    print(json.dumps(report["ratios"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
