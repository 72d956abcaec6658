"""Capacity: thousands of concurrent chat streams through `sluice serve` with its defaults, and
through vllm-router with its own, over a paced sim fleet, in one run.

The fleet is slow on purpose (`--workers` sim workers in one process, one engine step, so one
token per stream, every `--step-s`; `--tokens` per answer), so that what the two cores spend
relaying is small and the run measures what an open stream costs, not how fast the cores are.
Each target gets the same `--streams` streamed `/v1/chat/completions` (distinct prompts,
`ignore_eos`, usage included), opened over `--ramp-s` from 127.0.0.1 and all open at once for
most of an answer, from the lean client `loadtests/lib/stream_client.py` (one connection per
stream; the client raises its own fd limit). Targets, one after another on the same fleet:

- `direct`: the sim workers themselves (streams spread round-robin), the floor;
- `sluice`: `sluice serve --workers-file ...` with no admission, in-flight or connection flags.
  It starts with a soft fd limit of `--gateway-soft-fd` (1024, as a systemd service gets) and
  the hard limit this process has: it must raise it itself;
- `sluice_frontends<N>` with `--frontends N` (when given): skipped, with the reason, when the
  server refuses it or never answers;
- `vllm_router`: vllm-router 0.1.17 with its default policy (`cache_aware`) and limits.

Per target: streams finished whole (200, `[DONE]`, every token, no error event), 503s, error
events, TTFT p50/p99, inter-token gap p99 and the worst gap of a stream at p99 (each minus the
direct path's), the gateway's RSS per open stream ((RSS at the plateau, all streams open, minus
its RSS at rest after a warm-up) / streams open), and the gateway's CPU per 1,000 tokens.

    flock /tmp/sluice-bench.lock .venv/bin/python loadtests/relay/bench_capacity.py --streams 1000

Writes loadtests/reports/capacity.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadtests.lib import procs
from loadtests.lib.stream_client import StreamConn, StreamResult
from loadtests.relay.capacity_report import plot, summarize

REPORTS = ROOT / "loadtests" / "reports"
PATH = "/v1/chat/completions"


def raise_own_fd_limit() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def body(k: int, tokens: int) -> dict[str, Any]:
    return {"model": procs.MODEL, "max_tokens": tokens, "stream": True, "ignore_eos": True, "temperature": 0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"User {k} asks: what does a sluice gate do?"}]}


_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _stats() -> dict[int, list[str]]:
    """The fields of /proc/<pid>/stat after the command name, by pid."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    out[int(entry)] = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
    return out


def tree(proc: subprocess.Popen[bytes], stats: dict[int, list[str]] | None = None) -> dict[int, list[str]]:
    """`proc` and every live descendant (a `--frontends` supervisor's children start sessions of their own)."""
    stats = _stats() if stats is None else stats
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    out, todo = {}, [proc.pid]
    while todo:
        pid = todo.pop()
        if pid in stats:
            out[pid] = stats[pid]
            todo.extend(children.get(pid, ()))
    return out


def rss_bytes(proc: subprocess.Popen[bytes]) -> int:
    return sum(int(f[21]) for f in tree(proc).values()) * _PAGE  # field 24 of stat: RSS in pages


def cpu_s(proc: subprocess.Popen[bytes]) -> float:
    return sum(int(f[11]) + int(f[12]) for f in tree(proc).values()) * _TICK_S  # utime + stime


def soft_fd_limits(proc: subprocess.Popen[bytes]) -> list[int]:
    """The soft fd limit each process of `proc`'s tree runs with."""
    out = []
    for pid in tree(proc):
        try:
            for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
                if line.startswith("Max open files"):
                    out.append(int(line.split()[3]))
        except (OSError, ValueError):
            continue
    return out


class Load:
    """`n` streams opened over `ramp_s`, spread over `ports`; counts what is in flight."""

    def __init__(self, ports: list[int], n: int, tokens: int, ramp_s: float, timeout_s: float) -> None:
        self.ports, self.n, self.tokens, self.ramp_s, self.timeout_s = ports, n, tokens, ramp_s, timeout_s
        self.inflight = 0
        self.results: list[StreamResult] = []
        self.failures: list[str] = []

    async def one(self, k: int, start: float) -> None:
        await asyncio.sleep(max(0.0, start + k * self.ramp_s / self.n - time.perf_counter()))
        conn = StreamConn("127.0.0.1", self.ports[k % len(self.ports)])
        self.inflight += 1
        try:
            self.results.append(await asyncio.wait_for(conn.post_stream(PATH, body(k, self.tokens)),
                                                       self.timeout_s))
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
            self.failures.append(repr(e)[:200])
        finally:
            self.inflight -= 1
            await conn.close()

    async def run(self, gateway: subprocess.Popen[bytes] | None, samples: list[dict[str, float]]) -> float:
        start = time.perf_counter()
        tasks = [asyncio.create_task(self.one(k, start)) for k in range(self.n)]
        while not all(t.done() for t in tasks):
            samples.append({"t_s": round(time.perf_counter() - start, 2), "inflight": self.inflight,
                            "rss_mib": rss_bytes(gateway) / 2**20 if gateway is not None else 0.0})
            await asyncio.sleep(0.5)
        await asyncio.gather(*tasks)
        return time.perf_counter() - start


async def warm_up(port: int, tokens: int) -> None:
    async def one(k: int) -> None:
        conn = StreamConn("127.0.0.1", port)
        try:
            await asyncio.wait_for(conn.post_stream(PATH, body(-k, tokens)), 120)
        finally:
            await conn.close()

    await asyncio.gather(*(one(k) for k in range(16)))


def measure(name: str, ports: list[int], gateway: subprocess.Popen[bytes] | None, sim: subprocess.Popen[bytes],
            args: argparse.Namespace) -> dict[str, Any]:
    asyncio.run(warm_up(ports[0], 2))
    time.sleep(3.0)
    idle = rss_bytes(gateway) if gateway is not None else 0
    watched = {"gateway": gateway, "sim": sim} if gateway is not None else {"sim": sim}
    before = {k: cpu_s(p) for k, p in watched.items() if p is not None}
    own = os.times()
    load = Load(ports, args.streams, args.tokens, args.ramp_s, args.timeout_s)
    samples: list[dict[str, float]] = []
    wall = asyncio.run(load.run(gateway, samples))
    cpu = {k: cpu_s(p) - before[k] for k, p in watched.items() if p is not None}
    cpu["client"] = sum(os.times()[:2]) - sum(own[:2])
    row = summarize(load.results, load.failures, args.streams, args.tokens, samples, idle, cpu)
    row.update({"target": name, "wall_s": round(wall, 1), "loadavg_1m_at_end": round(os.getloadavg()[0], 2)})
    if gateway is not None:
        row["gateway_soft_fd_limits_running"] = soft_fd_limits(gateway)
    print(f"{name:<20} whole {row['finished_whole']}/{args.streams}  503 {row['status_503']}  errors "
          f"{row['error_events']}  ttft p99 {row['ttft_p99_ms']} ms  rss/stream {row['rss_per_stream_kib']} KiB",
          flush=True)
    return row


def start_sluice(port: int, wf: Path, scratch: Path, soft_fd: int, frontends: int) -> subprocess.Popen[bytes]:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--http-port", str(port),
            "--grpc-port", "0", "--model-repository", str(procs.gateway_repository(scratch)), "--workers-file",
            str(wf), "--log-level", "warning", *(["--frontends", str(frontends)] if frontends else [])]
    log = scratch / (f"sluice_frontends{frontends}.log" if frontends else "sluice.log")

    def lower_soft_fd_limit() -> None:  # as a systemd service starts: the gateway must raise it itself
        if soft_fd:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft_fd, hard), hard))

    with open(log, "wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, start_new_session=True, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=lower_soft_fd_limit)


def start_vllm_router(port: int, urls: list[str], scratch: Path) -> subprocess.Popen[bytes]:
    argv = [str(procs.tools_venv() / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(procs.free_ports(1)[0]),
            "--worker-urls", *urls, "--log-level", "warning"]
    return procs.spawn(argv, scratch / "vllm_router.log")


def run_target(name: str, scratch: Path, sim: subprocess.Popen[bytes], sim_ports: list[int], wf: Path,
               args: argparse.Namespace) -> dict[str, Any]:
    if name == "direct":
        return measure(name, sim_ports, None, sim, args)
    port = procs.free_ports(1)[0]
    if name == "vllm_router":
        proc = start_vllm_router(port, [f"http://127.0.0.1:{p}" for p in sim_ports], scratch)
    else:
        proc = start_sluice(port, wf, scratch, args.gateway_soft_fd, args.frontends if name != "sluice" else 0)
    try:
        try:
            procs.wait_ok(f"http://127.0.0.1:{port}", proc, timeout_s=180)
            asyncio.run(warm_up(port, 2))
        except Exception as e:
            log = (scratch / f"{name}.log").read_text(errors="replace")[-1500:]
            print(f"{name}: skipped ({e!r})", flush=True)
            return {"target": name, "skipped": f"{e!r}; log tail: {log}"}
        row = measure(name, [port], proc, sim, args)
        # What the gateway warned of (workers marked unhealthy, breakers): the scratch folder goes.
        warnings = [line for line in (scratch / f"{name}.log").read_text(errors="replace").splitlines()
                    if " WARNING " in line or " ERROR " in line]
        row["gateway_warnings"] = {"count": len(warnings), "last": warnings[-20:]}
        return row
    finally:
        procs.stop(proc)
        time.sleep(2.0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--step-s", type=float, default=2.0, help="one engine step (one token per stream) every")
    p.add_argument("--tokens", type=int, default=30, help="tokens per answer")
    p.add_argument("--ramp-s", type=float, default=10.0, help="streams are opened over this long")
    p.add_argument("--timeout-s", type=float, default=600.0, help="one stream, at most")
    p.add_argument("--frontends", type=int, default=0, help="also run `sluice serve --frontends N` (0: not)")
    p.add_argument("--targets", default="direct,sluice,frontends,vllm_router")
    p.add_argument("--gateway-soft-fd", type=int, default=1024, help="soft fd limit Sluice starts with (0: ours)")
    p.add_argument("--out", type=Path, default=REPORTS / "capacity.json")
    args = p.parse_args()
    hard = raise_own_fd_limit()
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sluice-capacity-") as tmp:
        scratch = Path(tmp)
        base, kv = procs.free_ports(2, span=2 * args.workers + 2)
        seqs = max(256, 2 * -(-args.streams // args.workers))
        extra = ["--max-num-seqs", str(seqs), "--num-gpu-blocks", str(4 * seqs), "--max-num-batched-tokens",
                 str(max(8192, 64 * seqs)), "--kv-events-port", str(kv), "--max-model-len", "2048"]
        sim = procs.sim_fleet(base, scratch / "sim.log", replicas=args.workers, profile=f"base_s={args.step_s}",
                              extra=extra)
        ports = [base + i for i in range(args.workers)]
        try:
            for port in ports:
                procs.wait_ok(f"http://127.0.0.1:{port}", sim)
            wf = procs.workers_file(scratch / "workers.yaml", ports, kv)
            for name in args.targets.split(","):
                if name == "frontends":
                    if not args.frontends:
                        continue
                    name = f"sluice_frontends{args.frontends}"
                rows.append(run_target(name, scratch, sim, ports, wf, args))
        except Exception:
            procs.tail_logs(scratch)
            raise
        finally:
            procs.stop(sim)
    direct = next((r for r in rows if r["target"] == "direct" and "skipped" not in r), None)
    for row in rows:
        if direct is not None and "skipped" not in row and row is not direct:
            for key in ("gap_p99_ms", "worst_gap_p99_ms", "ttft_p99_ms"):
                if row[key] is not None and direct[key] is not None:
                    row[f"{key}_over_direct"] = round(row[key] - direct[key], 1)
    report = {"benchmark": "concurrent chat streams over a paced sim fleet: direct, sluice (defaults), "
                           "vllm-router (defaults)",
              "streams": args.streams, "workers": args.workers, "step_s": args.step_s, "tokens": args.tokens,
              "ramp_s": args.ramp_s, "sim_max_num_seqs": seqs, "gateway_soft_fd_at_start": args.gateway_soft_fd,
              "fd_hard_limit": hard, "streams_the_fd_limit_allows": (hard - 256) // 2,
              "vllm_router": "vllm-router 0.1.17, defaults (cache_aware, max 32768 concurrent)",
              "rss_per_stream": "(median gateway RSS while >= 99% of the streams are in flight - RSS at rest after "
                                "a warm-up) / mean streams in flight then; RSS summed over the gateway's process tree",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "memory_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)},
              "total_s": round(time.monotonic() - t0, 1), "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    plot(report, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
