"""Classic-path benchmark, side by side in one run: Sluice (dynamic batching on and off) vs KServe's
ModelServer vs in-process onnxruntime, over KServe v2 gRPC and binary HTTP, with tritonclient.

Models: `digits` (the MLP, 9 µs of compute) and `cnn` (digits_cnn, the residual CNN, ~55 MFLOPs).
Every client sends single-row requests, closed loop, at each concurrency; the clients run in
separate processes (`load_client.py`) so the client's GIL is not what is measured. For one
(model, protocol, concurrency) the targets run one after another, in an order that alternates
between rounds, so a noisy neighbour hits them alike. Each segment records req/s, p50/p99
latency, and the server's CPU seconds per request: utime+stime from /proc of the server process
and every process under it (threads included), before and after the segment.

In-process onnxruntime is the limit: one session (one thread, as the servers' instances), the
same single rows from as many threads, and the throughput by batch size (1..64) on each model,
which is the most batching can gain on this CPU.

    flock /tmp/sluice-bench.lock .venv/bin/python loadtests/classic/bench_servers.py [--duration-s 3] [--rounds 2]
        [--frontends 1,2] [--server-src DIR] [--tag NAME]

Writes loadtests/reports/classic[-TAG].json and .png. Loops are bounded by count and time; only
127.0.0.1 is targeted. KServe runs from its own venv (scripts/ensure_kserve_venv.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadtests.classic.servers import (
    MODELS,
    Target,
    build_repo,
    inprocess_limit,
    load_average,
    start_kserve,
    start_null,
    start_sluice,
)

CONCURRENCY = (1, 8, 32, 64)
# Before this work: issue 13's figures (tritonclient at c=32 on the digits MLP, Sluice with dynamic
# batching) and the server's CPU per request at c=1 (digits_nodyn) from the py-spy run on the old
# code, loadtests/reports/profiles/before-summary.json. Written into every report beside the run's own.
BEFORE = {
    "source": "issue 13 (c=32) and loadtests/reports/profiles/before-summary.json (c=1, under py-spy)",
    "digits, grpc": {"sluice_rps_at_32": 1284, "kserve_rps_at_32": 1113, "vs_kserve_at_32": 1.15,
                     "server_cpu_us_per_req_at_1_unbatched": 488.3},
    "digits, http": {"sluice_rps_at_32": 1079, "kserve_rps_at_32": 990, "vs_kserve_at_32": 1.09,
                     "server_cpu_us_per_req_at_1_unbatched": 596.9},
}


def run_segment(target: Target, proto: str, model: str, concurrency: int, data: Path, args: argparse.Namespace
                ) -> dict:
    """One closed-loop segment against one target; the server's CPU is read around it."""
    procs = min(args.client_procs, concurrency)
    threads = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    spec = MODELS[model]
    clients = []
    for n in threads:
        cmd = [sys.executable, str(ROOT / "loadtests" / "classic" / "load_client.py"), "--proto", proto,
               "--url", target.url(proto), "--model", target.model_name(model), "--input", spec["input"],
               "--output", spec["output"], "--data", str(data), "--threads", str(n),
               "--duration-s", str(args.duration_s), "--max-requests", str(args.max_requests // procs)]
        clients.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for c in clients:
        if c.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            raise RuntimeError(f"a client failed to start against {target.name}")
    before_stats = target.batch_stats(model)
    cpu0, t0 = target.cpu_s(), time.perf_counter()
    for c in clients:
        c.stdin.write("go\n")  # type: ignore[union-attr]
        c.stdin.flush()  # type: ignore[union-attr]
    outs = [json.loads(c.communicate(timeout=args.duration_s + 120)[0].strip().splitlines()[-1]) for c in clients]
    wall, cpu = time.perf_counter() - t0, target.cpu_s() - cpu0
    lat = np.sort(np.concatenate([np.asarray(o["latencies"]) for o in outs]))
    elapsed = max(o["elapsed_s"] for o in outs)
    n = len(lat)
    result = {"concurrency": concurrency, "requests": n, "errors": sum(o["errors"] for o in outs),
              "first_error": next((o["first_error"] for o in outs if o["first_error"]), None),
              "elapsed_s": round(elapsed, 3), "throughput_rps": round(n / elapsed, 1) if n else 0.0,
              "p50_ms": round(float(lat[n // 2]) * 1000, 3) if n else None,
              "p99_ms": round(float(lat[min(n - 1, int(0.99 * n))]) * 1000, 3) if n else None,
              "server_cpu_us_per_req": round(cpu / n * 1e6, 1) if n else None,
              "server_cpu_cores": round(cpu / wall, 2),
              # The clients share the machine's cores with the server: what they spend bounds the rest.
              "client_cpu_us_per_req": round(sum(o["cpu_s"] for o in outs) / n * 1e6, 1) if n else None,
              "client_cpu_cores": round(sum(o["cpu_s"] for o in outs) / wall, 2)}
    after_stats = target.batch_stats(model)
    if before_stats and after_stats:
        rows, execs = (a - b for a, b in zip(after_stats, before_stats, strict=True))
        result["avg_batch_rows"] = round(rows / execs, 2) if execs else None
    return result


def bench(targets: list[Target], args: argparse.Namespace, data: dict[str, Path]) -> list[dict]:
    """Every (model, protocol, concurrency) with the targets alternating; the best round of each is kept."""
    series: dict[tuple[str, str, str], list[dict]] = {}
    for model in args.models:
        for proto in args.protocols:
            for c in args.concurrency:
                for r in range(args.rounds):
                    order = targets if r % 2 == 0 else targets[::-1]
                    for target in (t for t in order if proto in t.protocols):
                        res = run_segment(target, proto, model, c, data[model], args)
                        res["round"] = r
                        key = (model, proto, target.name)
                        print(f"{model:6s} {proto:4s} {target.name:18s} c={c:<3d} r{r} {res['throughput_rps']:>8.1f} "
                              f"req/s p50 {res['p50_ms']} ms p99 {res['p99_ms']} ms cpu "
                              f"{res['server_cpu_us_per_req']} us/req client {res['client_cpu_us_per_req']} us/req "
                              f"batch {res.get('avg_batch_rows', '-')} "
                              f"err {res['errors']}", flush=True)
                        series.setdefault(key, []).append(res)
    out = []
    for (model, proto, name), results in series.items():
        best: dict[int, dict] = {}
        for res in results:  # the best round per concurrency: noise only ever slows a segment down
            c = res["concurrency"]
            if c not in best or res["throughput_rps"] > best[c]["throughput_rps"]:
                best[c] = res
        out.append({"model": model, "protocol": proto, "target": name, "name": f"{name}, {proto}",
                    "results": [best[c] for c in sorted(best)], "all_rounds": results})
    return out


def summarise(series: list[dict], limits: dict) -> dict:
    by = {(s["model"], s["protocol"], s["target"]): {r["concurrency"]: r for r in s["results"]} for s in series}
    out: dict = {}
    for (model, proto, target), rows in by.items():
        if target != "sluice batched":
            continue
        kserve = by.get((model, proto, "kserve"), {})
        scaled = {t.split(", ")[1]: r for (m, p, t), r in by.items()
                  if m == model and p == proto and t.startswith("sluice batched, ")}
        kserve_scaled = {t.split(", ")[1]: r for (m, p, t), r in by.items()
                         if m == model and p == proto and t.startswith("kserve, ")}
        unbatched = by.get((model, proto, "sluice unbatched"), {})
        entry: dict = {}
        if 32 in rows and 32 in kserve:
            entry["vs_kserve_at_32"] = round(rows[32]["throughput_rps"] / kserve[32]["throughput_rps"], 2)
        for frontends, other in scaled.items():
            if 32 in other and 32 in kserve:
                entry[f"vs_kserve_at_32_with_{frontends.replace(' ', '_')}"] = round(
                    other[32]["throughput_rps"] / kserve[32]["throughput_rps"], 2)
            for workers, peer in kserve_scaled.items():  # the same number of processes on each side
                if 32 in other and 32 in peer:
                    entry[f"{frontends.replace(' ', '_')}_vs_kserve_{workers.replace(' ', '_')}_at_32"] = round(
                        other[32]["throughput_rps"] / peer[32]["throughput_rps"], 2)
        if 32 in rows and 32 in unbatched:
            entry["batching_gain_at_32"] = round(rows[32]["throughput_rps"] / unbatched[32]["throughput_rps"], 2)
        if 1 in unbatched:
            entry["server_cpu_us_per_req_at_1_unbatched"] = unbatched[1]["server_cpu_us_per_req"]
        if 1 in rows:
            entry["server_cpu_us_per_req_at_1_batched"] = rows[1]["server_cpu_us_per_req"]
        if 1 in kserve:
            entry["kserve_cpu_us_per_req_at_1"] = kserve[1]["server_cpu_us_per_req"]
        entry.update(_floor(by, model, proto, kserve))
        sweep = limits.get(model, {}).get("by_batch_size")
        if sweep:
            entry["inprocess_batching_gain"] = round(max(r["rows_per_s"] for r in sweep) / sweep[0]["rows_per_s"], 2)
        out[f"{model}, {proto}"] = entry
    return out


def _floor(by: dict, model: str, proto: str, kserve: dict) -> dict:
    """What the null servers (the protocol libraries alone, beside the same client) reached: if the best
    of them is under twice KServe's req/s at c=32, no server built on those libraries gets there here."""
    nulls = {t: r for (m, p, t), r in by.items() if m == model and p == proto and t.startswith("null server")}
    entry: dict = {}
    at_32 = [r[32]["throughput_rps"] for r in nulls.values() if 32 in r]
    if at_32 and 32 in kserve:
        entry["null_server_best_rps_at_32"] = max(at_32)
        entry["twice_kserve_rps_at_32"] = round(2 * kserve[32]["throughput_rps"], 1)
        entry["twice_kserve_within_null_server_reach"] = max(at_32) >= 2 * kserve[32]["throughput_rps"]
    single = nulls.get("null server", {})
    if 1 in single:
        entry["null_server_cpu_us_per_req_at_1"] = single[1]["server_cpu_us_per_req"]
    return entry


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({s["model"] for s in report["series"]})
    fig, axes = plt.subplots(len(models), 3, figsize=(16, 4.5 * len(models)), squeeze=False)
    for row, model in zip(axes, models, strict=True):
        targets = sorted({s["target"] for s in report["series"]})
        for s in (s for s in report["series"] if s["model"] == model):
            xs = [r["concurrency"] for r in s["results"]]
            style = "-" if s["protocol"] == "grpc" else "--"  # one colour per target, one dash per protocol
            color = plt.get_cmap("tab10")(targets.index(s["target"]) % 10)
            for ax, key in ((row[0], "throughput_rps"), (row[1], "p50_ms")):
                ax.plot(xs, [r[key] for r in s["results"]], style, marker="o", color=color, label=s["name"])
        limit = report["inprocess"].get(model, {})
        if limit.get("by_concurrency"):
            lc = limit["by_concurrency"]
            row[0].plot([r["concurrency"] for r in lc], [r["throughput_rps"] for r in lc], ":", color="k",
                        label="in-process onnxruntime")
        sweep = limit.get("by_batch_size", [])
        row[2].plot([r["batch_size"] for r in sweep], [r["rows_per_s"] for r in sweep], marker="o", color="k")
        row[0].set(xlabel="concurrency", ylabel="requests / s", title=f"{model}: throughput (1 row/request)",
                   xscale="log", yscale="log")
        row[1].set(xlabel="concurrency", ylabel="p50 latency (ms)", title=f"{model}: p50 latency", xscale="log",
                   yscale="log")
        row[2].set(xlabel="batch size", ylabel="rows / s", title=f"{model}: in-process onnxruntime by batch size",
                   xscale="log")
        if model == "digits":
            row[0].set_title(row[0].get_title() + "\n" + _before_after(report), fontsize=8)
        for ax in row:
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _before_after(report: dict) -> str:
    """One line per protocol: Sluice / KServe at c=32 and CPU per request at c=1, before and now."""
    lines = []
    for key in ("digits, grpc", "digits, http"):
        before, now = report.get("before", {}).get(key, {}), report["summary"].get(key, {})
        lines.append(f"{key}: x{before.get('vs_kserve_at_32')} -> x{now.get('vs_kserve_at_32')} KServe at c=32, "
                     f"{before.get('server_cpu_us_per_req_at_1_unbatched')} -> "
                     f"{now.get('server_cpu_us_per_req_at_1_unbatched')} us CPU/req at c=1")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=3.0)
    p.add_argument("--max-requests", type=int, default=30000)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--client-procs", type=int, default=2)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=list(CONCURRENCY))
    p.add_argument("--models", type=lambda s: s.split(","), default=["digits", "cnn"])
    p.add_argument("--protocols", type=lambda s: s.split(","), default=["grpc", "http"])
    p.add_argument("--targets", type=lambda s: s.split(","), default=["sluice", "kserve", "null"])
    p.add_argument("--null-processes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2],
                   help="a null server (null_server.py: the protocol alone) for each process count")
    p.add_argument("--frontends", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2],
                   help="a Sluice server for each value of its --frontends (1: batched and unbatched; more: batched)")
    p.add_argument("--kserve-workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2],
                   help="a KServe server for each value of its --workers (more than 1: HTTP only)")
    p.add_argument("--server-src", type=Path, default=ROOT, help="the Sluice checkout to serve from")
    p.add_argument("--tag", default="")
    p.add_argument("--out", type=Path, default=ROOT / "loadtests" / "reports")
    p.add_argument("--summarise-only", type=Path, metavar="REPORT",
                   help="recompute the summary and the plot of an existing report, and exit")
    args = p.parse_args()
    if args.duration_s <= 0 or args.max_requests <= 0 or args.rounds <= 0:
        raise SystemExit("--duration-s, --max-requests and --rounds must be positive")
    return args


def main() -> None:
    args = parse_args()
    if args.summarise_only is not None:
        report = json.loads(args.summarise_only.read_text())
        report["summary"] = summarise(report["series"], report["inprocess"])
        args.summarise_only.write_text(json.dumps(report, indent=2) + "\n")
        plot(report, args.summarise_only.with_suffix(".png"))
        print(json.dumps(report["summary"], indent=2))
        return
    root = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    targets: list[Target] = []
    try:
        repo, files, data = build_repo(root)
        load0 = load_average()
        if "sluice" in args.targets:
            for n in args.frontends:
                sluice = start_sluice(root, repo, args.server_src, n)
                if n == 1:
                    targets += [sluice.as_target("sluice batched", "dyn"),
                                sluice.as_target("sluice unbatched", "nodyn")]
                else:
                    targets.append(sluice.as_target(f"sluice batched, {n} frontends", "dyn"))
        if "kserve" in args.targets:
            targets += [start_kserve(root, files, n) for n in args.kserve_workers]
        if "null" in args.targets:
            targets += [start_null(root, n) for n in args.null_processes]
        limits = {m: inprocess_limit(files[m], MODELS[m], np.load(data[m]), args) for m in args.models}
        series = bench(targets, args, data)
        report = {
            "benchmark": "classic: digits MLP and digits CNN, Sluice vs KServe ModelServer vs in-process",
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_average_before": load0, "load_average_after": load_average()},
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "models": {m: {k: v for k, v in MODELS[m].items() if k != "config"} for m in args.models},
            "inprocess": limits, "series": series, "summary": summarise(series, limits), "before": BEFORE,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        stem = "classic" + (f"-{args.tag}" if args.tag else "")
        (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
        plot(report, args.out / f"{stem}.png")
        print(json.dumps(report["summary"], indent=2))
    finally:
        for target in targets:
            target.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
