"""One vLLM worker called directly vs through the Sluice gateway, same requests, one run.

Starts (unless --worker-url is given) one vLLM worker through the launcher, then
`sluice serve --worker URL` in front of it, and sends the same streaming chat
requests to both at each concurrency. Reports TTFT p50/p95 (ms) and output
tokens/s as JSON in loadtests/reports/vllm_gateway.json.

    .venv/bin/python loadtests/bench_vllm_gateway.py --model smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "loadtests" / "reports" / "vllm_gateway.json"
PROMPTS = ["What is the capital of France?", "Name three primary colours.", "Write a haiku about rivers.",
           "Explain what a sluice gate does.", "List four planets.", "What is 12 times 7?"]


def _spawn(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{url} not healthy after {timeout_s} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def _one(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int) -> tuple[float, int, float]:
    """(ttft_s, completion_tokens, total_s) for one streamed chat request."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content") and ttft is None:
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    total = time.perf_counter() - start
    return (ttft if ttft is not None else total), tokens, total


async def _measure(url: str, model: str, concurrency: int, requests: int, max_tokens: int) -> dict[str, float]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:
        async def run(i: int) -> tuple[float, int, float]:
            async with sem:
                return await _one(client, url, model, PROMPTS[i % len(PROMPTS)], max_tokens)

        await _one(client, url, model, PROMPTS[0], 4)  # warm-up
        start = time.perf_counter()
        results = await asyncio.gather(*(run(i) for i in range(requests)))
        wall = time.perf_counter() - start
    ttfts = sorted(r[0] * 1000 for r in results)
    return {"ttft_p50_ms": statistics.median(ttfts), "ttft_p95_ms": ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))],
            "tokens_per_s": sum(r[1] for r in results) / wall, "requests": requests}


async def _compare(worker: str, gateway: str, model: str, levels: list[int], max_tokens: int) -> list[dict[str, object]]:
    rows = []
    for c in levels:
        n = max(8, 2 * c)
        direct = await _measure(worker, model, c, n, max_tokens)  # same requests, same order, back to back
        via = await _measure(gateway, model, c, n, max_tokens)
        overhead = via["ttft_p50_ms"] - direct["ttft_p50_ms"]
        rows.append({"concurrency": c, "direct": direct, "gateway": via, "ttft_p50_overhead_ms": overhead})
        print(json.dumps(rows[-1]))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--worker-url", default=None, help="use a running worker instead of starting one")
    p.add_argument("--concurrency", default="1,8", help="comma-separated levels")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--worker-port", type=int, default=18600)
    p.add_argument("--gateway-port", type=int, default=18700)
    args = p.parse_args()
    procs = []
    try:
        worker = args.worker_url
        if worker is None:
            worker = f"http://127.0.0.1:{args.worker_port}"
            env = dict(os.environ)
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
            procs.append(_spawn([sys.executable, "-m", "engines.launchers", "--engine", "vllm", "--model", args.model,
                                 "--port", str(args.worker_port)], env))
            _wait_healthy(worker, procs[-1])
        gateway = f"http://127.0.0.1:{args.gateway_port}"
        procs.append(_spawn([sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--http-port",
                             str(args.gateway_port), "--grpc-port", "0", "--worker", worker]))
        _wait_healthy(gateway, procs[-1])
        levels = [int(x) for x in args.concurrency.split(",")]
        rows = asyncio.run(_compare(worker, gateway, args.model, levels, args.max_tokens))
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(json.dumps({"model": args.model, "max_tokens": args.max_tokens, "results": rows}, indent=2))
        print(f"wrote {REPORT}")
        return 0
    finally:
        for proc in reversed(procs):
            _stop(proc)


if __name__ == "__main__":
    sys.exit(main())
