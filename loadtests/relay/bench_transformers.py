"""Gateway overhead on the in-process transformers engine: HTTP through `sluice serve` vs calling the engine.

Same prompts, same max_tokens, greedy, `ignore_eos` (fixed output lengths), at 1, 8
and 32 concurrent streams, in one run. Each stream sends `--requests-per-stream`
requests one after another (closed loop).

- **in-process**: `TransformersEngine.generate(EngineRequest)` with the prompt ids the
  gateway would render (the model's chat template, same tokenizer).
- **gateway**: `sluice serve` as a subprocess on loopback, with a temporary repository
  holding only smollm2-135m-instruct; streamed `/v1/chat/completions` over httpx (SSE).

The two engines never run at the same time (the build machines have two cores): the
server loads first and is frozen with SIGSTOP outside its own segments, and the
in-process engine is started and stopped inside each of its segments. To spread
drift (other work on the machine) over both paths, each level runs A B B A
(A = in-process), so the paths being compared are minutes apart at most. The order,
the load average at each segment and each round's figures are in the report; the
summary pools the rounds.

    .venv/bin/python loadtests/relay/bench_transformers.py [--max-tokens 32] [--rounds 2]

Writes loadtests/reports/gateway_overhead.json and loadtests/reports/gateway_overhead.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadtests.lib.stats import percentile

MODEL = "smollm2-135m-instruct"
REPORTS = ROOT / "loadtests" / "reports"
PROMPTS = ["What is the capital of France?", "Name three primary colours.", "Write a haiku about rivers.",
           "Explain what a sluice gate does.", "List four planets.", "What is 12 times 7?",
           "Give one tip for learning to cook.", "Why is the sky blue?"]
REQUEST_TIMEOUT_S = 300.0  # one request; bounds every loop together with the request count


@dataclass(frozen=True, slots=True)
class Sample:
    ttft_s: float  # send to first non-empty text
    total_s: float
    completion_tokens: int
    prompt_tokens: int
    text: str


Send = Callable[[int], Awaitable[Sample]]  # prompt index -> one streamed generation


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


async def run_level(send: Send, concurrency: int, per_stream: int) -> dict[str, object]:
    """`concurrency` closed-loop streams, `per_stream` requests each; wall clock covers them all."""
    async def stream(k: int) -> list[Sample]:
        return [await asyncio.wait_for(send(k * per_stream + j), REQUEST_TIMEOUT_S) for j in range(per_stream)]

    start = time.perf_counter()
    samples = [s for group in await asyncio.gather(*(stream(k) for k in range(concurrency))) for s in group]
    wall_s = time.perf_counter() - start
    return {"concurrency": concurrency, "requests": len(samples), "wall_s": wall_s,
            "completion_tokens": sum(s.completion_tokens for s in samples),
            "tokens_per_s": sum(s.completion_tokens for s in samples) / wall_s,
            "ttft_ms": [s.ttft_s * 1000 for s in samples], "e2e_ms": [s.total_s * 1000 for s in samples],
            "prompt_tokens": sorted({s.prompt_tokens for s in samples}),
            "texts": {str(i % len(PROMPTS)): s.text for i, s in enumerate(samples)}}


# -- in-process ------------------------------------------------------------------
async def inprocess_level(model_dir: Path, concurrency: int, per_stream: int, max_tokens: int,
                          max_batch_size: int) -> dict[str, object]:
    """Start the engine (it warms up), run one level, stop it: it never shares the CPUs with the server's."""
    from engines.base import EngineRequest, SamplingParams
    from engines.text.tokenizer import ChatTokenizer
    from engines.transformers.engine import TransformersEngine, TransformersEngineConfig

    engine = TransformersEngine(TransformersEngineConfig(model_dir=model_dir, name=MODEL,
                                                         max_batch_size=max_batch_size))
    await engine.start()
    try:
        tok = ChatTokenizer(model_dir, engine.tokenizer)
        ids = [tok.render_chat(messages(i)) for i in range(len(PROMPTS))]
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        counter = iter(range(10**9))

        async def send(i: int) -> Sample:
            prompt = ids[i % len(ids)]
            req = EngineRequest(f"bench-{next(counter)}", MODEL, list(prompt), sampling, kind="chat")
            start = time.perf_counter()
            ttft, text, tokens = None, [], 0
            async for delta in engine.generate(req):
                if delta.text and ttft is None:
                    ttft = time.perf_counter() - start
                text.append(delta.text)
                tokens = delta.completion_tokens
            total = time.perf_counter() - start
            return Sample(ttft if ttft is not None else total, total, tokens, len(prompt), "".join(text))

        return await run_level(send, concurrency, per_stream)
    finally:
        await engine.stop()


# -- through the gateway -----------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(scratch: Path, max_batch_size: int) -> tuple[subprocess.Popen[bytes], str]:
    repo = scratch / "repo"
    shutil.copytree(ROOT / "model_repository" / MODEL, repo / MODEL)
    port = free_port()
    log = open(scratch / "server.log", "wb")  # noqa: SIM115 (the server process writes to it until stopped)
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--http-port",
                             str(port), "--grpc-port", "0", "--model-repository", str(repo),
                             "--max-batch-size", str(max_batch_size), "--log-level", "warning"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sluice serve exited with {proc.returncode}: {(scratch / 'server.log').read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError("sluice serve was not healthy after 300 s")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGCONT)  # a frozen process cannot act on SIGTERM
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def gateway_sender(client: httpx.AsyncClient, max_tokens: int) -> Send:
    async def send(i: int) -> Sample:
        body = {"model": MODEL, "messages": messages(i), "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        ttft, text, usage = None, [], {}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    raise RuntimeError(f"stream error: {chunk['error']}")
                for choice in chunk.get("choices") or []:
                    content = choice.get("delta", {}).get("content")
                    if content and ttft is None:
                        ttft = time.perf_counter() - start
                    text.append(content or "")
                usage = chunk.get("usage") or usage
        total = time.perf_counter() - start
        return Sample(ttft if ttft is not None else total, total, int(usage.get("completion_tokens", 0)),
                      int(usage.get("prompt_tokens", 0)), "".join(text))

    return send


# -- report ------------------------------------------------------------------------
def summarize(path_rounds: dict[str, list[list[dict[str, object]]]], levels: list[int]) -> list[dict[str, object]]:
    rows = []
    for i, c in enumerate(levels):
        row: dict[str, object] = {"concurrency": c}
        for path, rounds in path_rounds.items():
            ttft = [t for r in rounds for t in r[i]["ttft_ms"]]  # type: ignore[union-attr]
            e2e = [t for r in rounds for t in r[i]["e2e_ms"]]  # type: ignore[union-attr]
            tps = [float(r[i]["tokens_per_s"]) for r in rounds]  # type: ignore[arg-type]
            row[path] = {"tokens_per_s": statistics.mean(tps), "tokens_per_s_by_round": tps,
                         "ttft_p50_ms": percentile(ttft, 0.5), "ttft_p95_ms": percentile(ttft, 0.95),
                         "e2e_p50_ms": percentile(e2e, 0.5), "requests": len(ttft)}
        a, g = row["in_process"], row["gateway"]  # type: ignore[index]
        row["overhead"] = {
            "tokens_per_s_ratio": g["tokens_per_s"] / a["tokens_per_s"],  # gateway / in-process
            "ttft_p50_delta_ms": g["ttft_p50_ms"] - a["ttft_p50_ms"],
            "ttft_p95_delta_ms": g["ttft_p95_ms"] - a["ttft_p95_ms"],
            "ttft_p50_ratio": g["ttft_p50_ms"] / a["ttft_p50_ms"],
        }
        rows.append(row)
    return rows


def same_text(path_rounds: dict[str, list[list[dict[str, object]]]]) -> dict[str, object]:
    """Greedy outputs per prompt, in-process vs gateway (batch composition may flip a rare fp32 tie)."""
    def texts(path: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for rnd in path_rounds[path]:
            for level in rnd:
                for k, t in level["texts"].items():  # type: ignore[union-attr]
                    out.setdefault(k, set()).add(t)
        return out

    a, g = texts("in_process"), texts("gateway")
    equal = [k for k in a if a[k] == g.get(k)]
    return {"prompts": len(a), "identical_output_sets": len(equal)}


def plot(rows: list[dict[str, object]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    levels = [r["concurrency"] for r in rows]
    x = np.arange(len(levels))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, (key, label) in enumerate((("in_process", "in-process engine"), ("gateway", "gateway (HTTP/SSE)"))):
        tps = [r[key]["tokens_per_s"] for r in rows]  # type: ignore[index]
        p50 = np.array([r[key]["ttft_p50_ms"] for r in rows])  # type: ignore[index]
        p95 = np.array([r[key]["ttft_p95_ms"] for r in rows])  # type: ignore[index]
        ax1.bar(x + (k - 0.5) * 0.38, tps, 0.38, label=label)
        ax2.bar(x + (k - 0.5) * 0.38, p50, 0.38, label=f"{label} p50")
        ax2.errorbar(x + (k - 0.5) * 0.38, p50, yerr=[np.zeros_like(p50), p95 - p50], fmt="none", ecolor="k",
                     capsize=4)
    for ax, ylabel in ((ax1, "output tokens/s (aggregate)"), (ax2, "TTFT ms (bar p50, whisker p95)")):
        ax.set_xticks(x, [str(c) for c in levels])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def schedule(rounds: int) -> list[str]:
    """A B B A A B ...: each path runs `rounds` times, alternating which goes first."""
    pairs = [("in_process", "gateway") if r % 2 == 0 else ("gateway", "in_process") for r in range(rounds)]
    return [path for pair in pairs for path in pair]


async def run_all(args: argparse.Namespace, levels: list[int], per_stream: dict[int, int],
                  proc: subprocess.Popen[bytes], url: str) -> tuple[dict[str, list], list[dict[str, object]]]:
    """Per level, the A B B A schedule; the server is frozen (SIGSTOP) outside its own segments.

    Returns results[path][round][level index] and the segment order with times and load."""
    from engines.weights import resolve_llm

    model_dir = resolve_llm(MODEL, ROOT / "model_repository")
    results: dict[str, list[list[dict[str, object]]]] = {p: [[] for _ in range(args.rounds)]
                                                         for p in ("in_process", "gateway")}
    order: list[dict[str, object]] = []
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        send = gateway_sender(client, args.max_tokens)
        await send(0)  # the first HTTP request pays imports and the first batch shape
        os.killpg(proc.pid, signal.SIGSTOP)
        for c in levels:
            done = {"in_process": 0, "gateway": 0}
            for path in schedule(args.rounds):
                began, load = time.monotonic() - t0, os.getloadavg()[0]
                if path == "gateway":
                    os.killpg(proc.pid, signal.SIGCONT)
                    try:
                        row = await run_level(send, c, per_stream[c])
                    finally:
                        os.killpg(proc.pid, signal.SIGSTOP)
                else:
                    row = await inprocess_level(model_dir, c, per_stream[c], args.max_tokens, args.max_batch_size)
                results[path][done[path]].append(row)
                done[path] += 1
                order.append({"concurrency": c, "path": path, "start_s": round(began, 1),
                              "end_s": round(time.monotonic() - t0, 1), "loadavg_1m_at_start": load})
                print(f"c={c:>2} {path:<10} {row['tokens_per_s']:6.1f} tok/s  ttft p50 "
                      f"{statistics.median(row['ttft_ms']):7.0f} ms  (load {load:.1f})", flush=True)
    return results, order


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--requests-per-stream", default="3,1,1", help="per concurrency level, same order")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2, help="rounds per path, interleaved A B B A ...")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--out", type=Path, default=REPORTS / "gateway_overhead.json")
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    per_stream = dict(zip(levels, (int(n) for n in args.requests_per_stream.split(",")), strict=True))
    t0 = time.monotonic()
    # SIGTERM (e.g. from `timeout`) must unwind through the finally below: the server may be frozen.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as scratch:
        proc, url = start_server(Path(scratch), args.max_batch_size)  # loads while nothing else runs
        try:
            results, order = asyncio.run(run_all(args, levels, per_stream, proc, url))
        finally:
            stop_server(proc)
    rows = summarize(results, levels)
    report = {
        "benchmark": "gateway overhead: sluice serve over HTTP/SSE vs the in-process transformers engine",
        "model": MODEL, "engine": "transformers continuous batching, float32, CPU",
        "max_tokens": args.max_tokens, "greedy": True, "ignore_eos": True, "rounds_per_path": args.rounds,
        "requests_per_stream": per_stream, "client": "httpx SSE (gateway), engine.generate (in-process)",
        "isolation": "server started first and frozen with SIGSTOP outside its segments; the in-process engine "
                     "is started and stopped inside each of its segments; per level the paths run A B B A",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_at_end": os.getloadavg()},
        "order": order, "total_s": time.monotonic() - t0, "results": rows, "greedy_output_check": same_text(results),
        "rounds": {k: [[{kk: vv for kk, vv in lvl.items() if kk != "texts"} for lvl in r] for r in v]
                   for k, v in results.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    plot(rows, args.out.with_suffix(".png"),
         f"Sluice gateway vs in-process engine - {MODEL}, fp32 CPU, {args.max_tokens} tokens, greedy")
    for r in rows:
        print(json.dumps({"concurrency": r["concurrency"], **{k: r[k] for k in ("in_process", "gateway", "overhead")}}))
    print(f"wrote {args.out} ({report['total_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
