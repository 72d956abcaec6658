"""Relay overhead: a zero-delay sim worker called directly, through `sluice serve`, and through vllm-router.

One sim worker (`--engine sim --profile zero`: every engine step takes 0 s, so the worker
streams as fast as its own process can) and, in front of that same worker, `sluice serve`
(`--workers-file`, the worker's KV events on) and vllm-router (PyPI `vllm-router`, a Rust
binary, `--policy round_robin`). With `--baseline-src DIR` a second `sluice serve` runs the
code in DIR (e.g. `git archive <commit>`) as "sluice_before", and each `--variant NAME=FLAGS` a
`sluice serve FLAGS` of this tree as NAME, in the same run. `--sim-profile` paces the worker
(e.g. `base_s=0.01`: a token per stream every 10 ms, one per read: the per-event cost).

Each level (concurrent streams) runs every path once per round, in an order rotated from round
to round; each stream sends its requests one after another on one keep-alive connection
(closed loop). Requests: streamed `/v1/completions` with a token-id prompt (or `/v1/chat/
completions` with `--kind chat`), `max_tokens` 256, `ignore_eos`, usage included. The client
(`loadtests/lib/stream_client.py`) stamps every SSE event as it reads it.

Reported per level and path: output tokens/s, TTFT p50/p99, inter-event latency (ITL) p50/p99,
per-request TPOT, and each process's CPU time per 1,000 tokens; per relay the difference to the
direct path. With `--profile-s S`, py-spy records the Sluice gateway during an extra,
unmeasured segment at `--profile-level` streams; the raw profile and its summary are saved.

    flock /tmp/sluice-bench.lock .venv/bin/python loadtests/relay/bench_sim.py --baseline-src /tmp/sluice-base

Writes loadtests/reports/relay_overhead.json and .png (and relay_overhead_profile_*.txt: named after --out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadtests.lib import procs
from loadtests.lib.pyspy_summary import summarize
from loadtests.lib.stats import percentile
from loadtests.lib.stream_client import StreamConn, StreamResult

REPORTS = ROOT / "loadtests" / "reports"
REQUEST_TIMEOUT_S = 120.0


def request_body(kind: str, max_tokens: int, prompt_tokens: int) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": procs.MODEL, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
                            "temperature": 0, "stream_options": {"include_usage": True}}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": "Explain what a sluice gate does, in detail."}]
        return "/v1/chat/completions", body
    body["prompt"] = [100 + (i * 7919) % 40000 for i in range(prompt_tokens)]
    return "/v1/completions", body


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def run_segment(port: int, path: str, body: dict[str, Any], concurrency: int, per_stream: int
                      ) -> tuple[list[StreamResult], float]:
    async def stream() -> list[StreamResult]:
        conn = StreamConn("127.0.0.1", port)
        try:
            return [await asyncio.wait_for(conn.post_stream(path, body), REQUEST_TIMEOUT_S) for _ in range(per_stream)]
        finally:
            await conn.close()

    start = time.perf_counter()
    groups = await asyncio.gather(*(stream() for _ in range(concurrency)))
    return [r for g in groups for r in g], time.perf_counter() - start


def segment_row(results: list[StreamResult], wall_s: float, cpu: dict[str, float]) -> dict[str, Any]:
    bad = [r for r in results if r.status != 200 or r.error or not r.done]
    tokens = sum(r.completion_tokens for r in results)
    ttft = [r.ttft_s * 1000 for r in results if r.ttft_s is not None]
    itl = [x * 1000 for r in results for x in r.itl_s]
    tpot = [(r.content_times_s[-1] - r.content_times_s[0]) * 1000 / (r.completion_tokens - 1)
            for r in results if len(r.content_times_s) > 1 and r.completion_tokens > 1]
    return {"requests": len(results), "failed": len(bad), "first_error": bad[0].error if bad else None,
            "tokens": tokens, "wall_s": round(wall_s, 3), "tokens_per_s": tokens / wall_s,
            "events_per_request": statistics.fmean(len(r.content_times_s) for r in results),
            "ttft_ms": ttft, "itl_ms": itl, "tpot_ms": tpot,
            "cpu_ms_per_1k_tokens": {k: round(v * 1e6 / max(tokens, 1), 1) for k, v in cpu.items()}}


async def measure(paths: dict[str, int], group: dict[str, subprocess.Popen[bytes]], levels: list[int],
                  rounds: int, kind: str, max_tokens: int, prompt_tokens: int, min_requests: int,
                  max_load: float = 99.0, max_wait_s: float = 0.0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    path, body = request_body(kind, max_tokens, prompt_tokens)
    warm = dict(body, max_tokens=4)
    names = list(paths)
    order: list[dict[str, Any]] = []
    segments: list[dict[str, Any]] = []
    for c in levels:
        procs.wait_quiet(max_load, max_wait_s)
        per_stream = max(1, -(-min_requests // c), 2 if c >= 16 else 1)
        for r in range(rounds):
            k = (r + levels.index(c)) % len(names)
            for name in names[k:] + names[:k]:
                await run_segment(paths[name], path, warm, c, 1)  # connections opened, pools grown
                before = {p: procs.cpu_s(proc) for p, proc in group.items()}
                before["client"] = _own_cpu_s()
                load1 = os.getloadavg()[0]
                results, wall = await run_segment(paths[name], path, body, c, per_stream)
                cpu = {p: procs.cpu_s(proc) - before[p] for p, proc in group.items()}
                cpu["client"] = _own_cpu_s() - before["client"]
                row = segment_row(results, wall, cpu)
                segments.append({"concurrency": c, "round": r, "path": name, **row})
                order.append({"concurrency": c, "round": r, "path": name, "loadavg_1m": round(load1, 2)})
                print(f"c={c:<4} {name:<14} {row['tokens_per_s']:9.0f} tok/s  ttft p50 "
                      f"{percentile(row['ttft_ms'], 0.5) or 0:8.2f} ms  failed {row['failed']}  load {load1:.2f}",
                      flush=True)
    return segments, order


def summarize_levels(segments: list[dict[str, Any]], levels: list[int], names: list[str]) -> list[dict[str, Any]]:
    rows = []
    for c in levels:
        row: dict[str, Any] = {"concurrency": c}
        for name in names:
            segs = [s for s in segments if s["concurrency"] == c and s["path"] == name]
            ttft = [x for s in segs for x in s["ttft_ms"]]
            itl = [x for s in segs for x in s["itl_ms"]]
            tpot = [x for s in segs for x in s["tpot_ms"]]
            cpu: dict[str, float] = {}
            for s in segs:
                for proc, v in s["cpu_ms_per_1k_tokens"].items():
                    cpu[proc] = cpu.get(proc, 0.0) + v / len(segs)
            row[name] = {"tokens_per_s": statistics.fmean(s["tokens_per_s"] for s in segs),
                         "tokens_per_s_by_round": [round(s["tokens_per_s"]) for s in segs],
                         "ttft_p50_ms": percentile(ttft, 0.5), "ttft_p99_ms": percentile(ttft, 0.99),
                         "itl_p50_ms": percentile(itl, 0.5), "itl_p99_ms": percentile(itl, 0.99),
                         "tpot_p50_ms": percentile(tpot, 0.5),
                         "events_per_request": statistics.fmean(s["events_per_request"] for s in segs),
                         "requests": sum(s["requests"] for s in segs), "failed": sum(s["failed"] for s in segs),
                         "cpu_ms_per_1k_tokens": {k: round(v, 1) for k, v in cpu.items()}}
        direct = row["direct"]
        for name in names:
            if name == "direct":
                continue
            via = row[name]
            via["added"] = {k: (via[f"{k}_ms"] - direct[f"{k}_ms"]) if via[f"{k}_ms"] is not None
                            and direct[f"{k}_ms"] is not None else None
                            for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tpot_p50")}
            via["tokens_per_s_vs_direct"] = via["tokens_per_s"] / direct["tokens_per_s"]
        rows.append(row)
    return rows


def profile(pid: int, port: int, kind: str, level: int, seconds: float, max_tokens: int, prompt_tokens: int,
            out: Path) -> dict[str, Any]:
    """py-spy the process while an unmeasured segment keeps it busy."""
    spy = procs.tools_venv() / "bin" / "py-spy"
    cmd = [str(spy), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200", "--format",
           "raw", "--nonblocking", "-o", str(out)]
    recorder = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path, body = request_body(kind, max_tokens, prompt_tokens)
    end = time.monotonic() + seconds + 1

    async def load() -> None:
        while time.monotonic() < end:
            await run_segment(port, path, body, level, 1)

    asyncio.run(load())
    recorder.wait(timeout=60)
    return summarize(out.read_text(), 25) if out.is_file() else {"error": "py-spy wrote no profile"}


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def start_all(scratch: Path, args: argparse.Namespace, group: dict[str, subprocess.Popen[bytes]]) -> dict[str, int]:
    """Start every process into `group` (so the caller stops what started even if a later one fails)."""
    sim_port, gw_port, before_port, vr_port = procs.free_ports(4, span=3)
    kv = sim_port + 1  # the sim's first KV-event port pair (PUB, replay), below the next free base
    extra = ["--max-num-seqs", "2048", "--num-gpu-blocks", "16384", "--max-num-batched-tokens", "65536",
             "--kv-events-port", str(kv), "--max-model-len", "4096"]
    group["sim"] = procs.sim_fleet(sim_port, scratch / "sim.log", extra=extra, profile=args.sim_profile)
    procs.wait_ok(f"http://127.0.0.1:{sim_port}", group["sim"])
    wf = procs.workers_file(scratch / "workers.yaml", [sim_port], kv)
    group["sluice"] = procs.sluice(gw_port, wf, scratch / "sluice.log")
    paths = {"direct": sim_port, "sluice": gw_port, "vllm_router": vr_port}
    if args.baseline_src:
        group["sluice_before"] = procs.sluice(before_port, wf, scratch / "sluice_before.log",
                                              src=Path(args.baseline_src))
        paths["sluice_before"] = before_port
    for variant in args.variant:  # NAME=FLAGS: another `sluice serve` of this tree, with these flags
        name, _, flags = variant.partition("=")
        port = procs.free_ports(1)[0]
        group[name] = procs.sluice(port, wf, scratch / f"{name}.log", extra=shlex.split(flags))
        paths[name] = port
    group["vllm_router"] = procs.vllm_router(vr_port, [f"http://127.0.0.1:{sim_port}"], "round_robin",
                                             scratch / "vllm_router.log")
    for name, port in paths.items():
        procs.wait_ok(f"http://127.0.0.1:{port}", group.get(name, group["sim"]))
    return paths


def plot(rows: list[dict[str, Any]], names: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["concurrency"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for name in names:
        axes[0].plot(xs, [r[name]["tokens_per_s"] for r in rows], marker="o", label=name)
        if name != "direct":
            axes[1].plot(xs, [r[name]["added"]["ttft_p50"] for r in rows], marker="o", label=f"{name} p50")
            axes[1].plot(xs, [r[name]["added"]["ttft_p99"] for r in rows], marker="x", ls=":", label=f"{name} p99")
            axes[2].plot(xs, [r[name]["cpu_ms_per_1k_tokens"].get(name, 0) for r in rows], marker="o", label=name)
    for ax, ylabel in zip(axes, ("output tokens/s (all streams)", "added TTFT vs direct (ms)",
                                 "relay process CPU ms per 1k tokens"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[1].set_yscale("symlog", linthresh=1)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", default="1,4,16,64,256,512")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--kind", choices=("completions", "chat"), default="completions")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--min-requests", type=int, default=40, help="requests per segment at least")
    p.add_argument("--baseline-src", default=None, help="a source tree whose gateway runs as sluice_before")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                   help="also measure `sluice serve FLAGS` of this tree as NAME (e.g. "
                        "'sluice_interval0=--relay-interval-ms 0')")
    p.add_argument("--sim-profile", default="zero",
                   help="the sim worker's step times (e.g. base_s=0.01: a token per stream every 10 ms) [zero]")
    p.add_argument("--profile-s", type=float, default=0, help="py-spy the gateway(s) this long at --profile-level")
    p.add_argument("--profile-level", type=int, default=64)
    p.add_argument("--max-load", type=float, default=3.0, help="before each level, wait for a load average below")
    p.add_argument("--max-wait-s", type=float, default=60.0, help="... for at most this long")
    p.add_argument("--out", type=Path, default=REPORTS / "relay_overhead.json")
    args = p.parse_args()
    args.out = args.out.resolve()
    levels = [int(x) for x in args.levels.split(",")]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-relay-") as tmp:
        scratch = Path(tmp)
        group: dict[str, subprocess.Popen[bytes]] = {}
        try:
            paths = start_all(scratch, args, group)
            segments, order = asyncio.run(measure(paths, group, levels, args.rounds, args.kind, args.max_tokens,
                                                  args.prompt_tokens, args.min_requests, args.max_load,
                                                  args.max_wait_s))
            profiles = {}
            for name in ("sluice", "sluice_before", *(v.partition("=")[0] for v in args.variant)):
                if args.profile_s > 0 and name in paths:
                    raw = args.out.with_name(f"{args.out.stem}_profile_{name}.txt")
                    profiles[name] = {"raw": _shown(raw), "level": args.profile_level,
                                      **profile(group[name].pid, paths[name], args.kind, args.profile_level,
                                                args.profile_s, args.max_tokens, args.prompt_tokens, raw)}
        except Exception:
            procs.tail_logs(scratch)
            raise
        finally:
            for proc in reversed(list(group.values())):
                procs.stop(proc)
    names = list(paths)
    rows = summarize_levels(segments, levels, names)
    report = {"benchmark": "relay overhead against a zero-delay sim worker: direct vs sluice vs vllm-router",
              "kind": args.kind, "max_tokens": args.max_tokens, "prompt_tokens": args.prompt_tokens,
              "ignore_eos": True, "rounds": args.rounds, "paths": names,
              "worker": f"sluice worker --engine sim --profile {args.sim_profile} (one process)",
              "vllm_router": "vllm-router 0.1.17 --policy round_robin", "baseline_src": args.baseline_src,
              "variants": args.variant,
              "client": "loadtests/lib/stream_client.py: raw HTTP/1.1, one keep-alive connection per stream, "
                        "closed loop",
              "itl": "time between consecutive SSE events with content, as the client read them",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "loadavg_at_end": os.getloadavg()},
              "total_s": round(time.monotonic() - t0, 1), "order": order, "results": rows,
              "peak_tokens_per_s": {n: max(r[n]["tokens_per_s"] for r in rows) for n in names},
              "profiles": profiles,
              "segments": [{k: v for k, v in s.items() if k not in ("ttft_ms", "itl_ms", "tpot_ms")}
                           for s in segments]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    plot(rows, names, args.out.with_suffix(".png"),
         f"relay overhead, zero-delay sim worker, {args.kind}, {args.max_tokens} tokens/stream")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
