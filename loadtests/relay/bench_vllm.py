"""One vLLM worker called directly vs through the Sluice gateway, same requests, one run.

Starts (unless --worker-url is given) one vLLM worker through the launcher, then
`sluice serve --worker vllm=URL` in front of it (with a temporary repository that
holds only the model's config, so the gateway finds the tokenizer and loads nothing
else), and sends the same streaming chat requests to both at each concurrency:
greedy, `ignore_eos`, fixed output length. Which path goes first alternates from
level to level (recorded as `order`). Reports TTFT p50/p95 (ms) and output tokens/s
as JSON in loadtests/reports/vllm_gateway.json, and a PNG next to it.

    .venv/bin/python loadtests/relay/bench_vllm.py --model smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "loadtests" / "reports" / "vllm_gateway.json"
PROMPTS = ["What is the capital of France?", "Name three primary colours.", "Write a haiku about rivers.",
           "Explain what a sluice gate does.", "List four planets.", "What is 12 times 7?"]


def _spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # Logs go to a file: DEVNULL hid why a worker or the gateway failed to start.
    with open(log, "wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True, stdout=out,
                                stderr=subprocess.STDOUT)


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


async def _one(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int
               ) -> tuple[float, int, float]:
    """(ttft_s, completion_tokens, total_s) for one streamed chat request."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
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


async def _compare(worker: str, gateway: str, model: str, levels: list[int], max_tokens: int
                   ) -> list[dict[str, object]]:
    rows = []
    for i, c in enumerate(levels):
        n = max(8, 2 * c)
        # Same requests, same order, back to back; alternating which path goes first spreads drift.
        paths = [("direct", worker), ("gateway", gateway)]
        if i % 2:
            paths.reverse()
        row: dict[str, object] = {"concurrency": c, "order": [name for name, _ in paths]}
        for name, url in paths:
            row[name] = await _measure(url, model, c, n, max_tokens)
        direct, via = row["direct"], row["gateway"]
        row["ttft_p50_overhead_ms"] = via["ttft_p50_ms"] - direct["ttft_p50_ms"]  # type: ignore[index]
        row["ttft_p95_overhead_ms"] = via["ttft_p95_ms"] - direct["ttft_p95_ms"]  # type: ignore[index]
        row["tokens_per_s_ratio"] = via["tokens_per_s"] / direct["tokens_per_s"]  # type: ignore[index]
        rows.append(row)
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _plot(rows: list[dict[str, object]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = list(range(len(rows)))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for k, (key, label) in enumerate((("direct", "vLLM direct"), ("gateway", "through gateway"))):
        xs = [v + (k - 0.5) * 0.38 for v in x]
        p50 = [r[key]["ttft_p50_ms"] for r in rows]  # type: ignore[index]
        p95 = [r[key]["ttft_p95_ms"] for r in rows]  # type: ignore[index]
        ax1.bar(xs, [r[key]["tokens_per_s"] for r in rows], 0.38, label=label)  # type: ignore[index]
        ax2.bar(xs, p50, 0.38, label=f"{label} p50")
        err = [[0] * len(p50), [b - a for a, b in zip(p50, p95, strict=True)]]
        ax2.errorbar(xs, p50, yerr=err, fmt="none", ecolor="k", capsize=4)
    for ax, ylabel in ((ax1, "output tokens/s (aggregate)"), (ax2, "TTFT ms (bar p50, whisker p95)")):
        ax.set_xticks(x, [str(r["concurrency"]) for r in rows])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gateway_repository(model: str, scratch: Path) -> Path:
    """A repository with only the model's config (the gateway's tokenizer source), or none for a path."""
    repo = scratch / "repo"
    repo.mkdir()
    src = ROOT / "model_repository" / model
    if (src / "config.pbtxt").is_file():
        shutil.copytree(src, repo / model)
    return repo


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--worker-url", default=None, help="use a running worker instead of starting one")
    p.add_argument("--concurrency", default="1,8", help="comma-separated levels")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--worker-port", type=int, default=18600)
    p.add_argument("--gateway-port", type=int, default=18700)
    p.add_argument("--out", type=Path, default=REPORT)
    args = p.parse_args()
    procs = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-vllm-bench-") as tmp:
        scratch = Path(tmp)
        try:
            worker = args.worker_url
            if worker is None:
                worker = f"http://127.0.0.1:{args.worker_port}"
                env = dict(os.environ)
                env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
                procs.append(_spawn([sys.executable, "-m", "engines.launchers", "--engine", "vllm", "--model",
                                     args.model, "--port", str(args.worker_port)], scratch / "worker.log", env))
                _wait_healthy(worker, procs[-1])
            worker_ready_s = time.monotonic() - t0
            gateway = f"http://127.0.0.1:{args.gateway_port}"
            procs.append(_spawn([sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--http-port",
                                 str(args.gateway_port), "--grpc-port", "0", "--model-repository",
                                 str(_gateway_repository(args.model, scratch)), "--worker", f"vllm={worker}"],
                                scratch / "gateway.log"))
            _wait_healthy(gateway, procs[-1])
            levels = [int(x) for x in args.concurrency.split(",")]
            rows = asyncio.run(_compare(worker, gateway, args.model, levels, args.max_tokens))
        except Exception:
            for log in sorted(scratch.glob("*.log")):
                print(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
        finally:
            for proc in reversed(procs):
                _stop(proc)
    report = {"model": args.model, "engine": "vllm-cpu 0.32.0, fp32, enforce-eager, one worker",
              "max_tokens": args.max_tokens, "greedy": True, "ignore_eos": True,
              "worker_ready_s": round(worker_ready_s, 1), "total_s": round(time.monotonic() - t0, 1),
              "machine": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()}, "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    _plot(rows, args.out.with_suffix(".png"), f"vLLM worker direct vs through the Sluice gateway - {args.model}, "
          f"fp32 CPU, {args.max_tokens} tokens, greedy")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
