"""Classic-path benchmark with clients that cost little CPU, as Triton users measure: wrk over HTTP
(KServe v2 binary tensors, `kserve_binary.lua`) and h2load over gRPC (HTTP/2 carrying a ModelInfer
message framed by hand), both C programs from Debian, against Sluice (dynamic batching on and off),
KServe's ModelServer and the null server (the protocol libraries alone), beside in-process
onnxruntime, in one run on this machine.

Why: the Python load clients of bench_servers.py spent 230-320 µs of CPU per request on the same two
cores as the server, so they, not the server, set the ceiling. Here each segment also reports the
client's own CPU per request (its process's rusage), so the reader sees the server's share.

Models: `digits` (the MLP), `cnn` (digits_cnn) and `ocr` (the default repository's OCR pipeline on
one rendered page; Sluice and in-process only: KServe has no pipeline). Closed loop: c connections,
one request in flight on each. `errors` are the client's (non-200 answers, socket errors);
`server_failures` are Sluice's own failure count over the segment, which includes the requests a
client abandons when its duration ends (h2load leaves at most one per connection in flight).

    flock /tmp/sluice-bench.lock .venv/bin/python loadtests/classic/bench_lowcost.py [--duration-s 5]
        [--models digits,cnn,ocr] [--concurrency 1,8,32,64] [--tag NAME]

Writes loadtests/reports/classic_lowcost[-TAG].json and .png. Only 127.0.0.1 is targeted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadtests.classic.lowcost_support import (
    OCR,
    inprocess_ocr,
    ocr_page,
    plot,
    request_bodies,
    sluice_counts,
    summarise,
)
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
from tests.integration.ocr_support import ocr_repository

LUA = ROOT / "loadtests" / "classic" / "kserve_binary.lua"


def _child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_wrk(target: Target, model: str, bodies: dict[str, Any], c: int, duration_s: float) -> dict[str, Any]:
    env = {**os.environ, "SLUICE_WRK_BODY": str(bodies["http"]), "SLUICE_WRK_HEADER_LENGTH": str(bodies["header"])}
    url = f"http://{target.http}/v2/models/{target.model_name(model)}/infer"
    cmd = ["wrk", "-t", str(min(c, 2)), "-c", str(c), "-d", f"{max(1, round(duration_s))}s", "--timeout", "30s",
           "-s", str(LUA), url]
    cpu0 = _child_cpu_s()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=duration_s + 120, check=True).stdout
    cpu = _child_cpu_s() - cpu0
    line = next(x for x in out.splitlines() if x.startswith("WRK_JSON "))
    w = json.loads(line.removeprefix("WRK_JSON "))
    n = w["requests"]
    return {"requests": n, "errors": sum(w["errors"].values()),
            "throughput_rps": round(n / (w["duration_us"] / 1e6), 1),
            "p50_ms": w["p50_us"] / 1000, "p99_ms": w["p99_us"] / 1000,
            "client_cpu_us_per_req": round(cpu / n * 1e6, 1) if n else None}


def run_h2load(target: Target, model: str, bodies: dict[str, Any], c: int, duration_s: float, tmp: Path
               ) -> dict[str, Any]:
    log = tmp / "h2load.log"
    log.unlink(missing_ok=True)
    url = f"http://{target.grpc}/inference.GRPCInferenceService/ModelInfer"
    cmd = ["h2load", "-c", str(c), "-m", "1", "-t", str(min(c, 2)), "-D", str(int(duration_s)), "-d",
           str(bodies["grpc"][target.model_name(model)]), "-H", "content-type: application/grpc", "-H", "te: trailers",
           "--log-file", str(log), url]
    cpu0 = _child_cpu_s()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 120, check=True).stdout
    cpu = _child_cpu_s() - cpu0
    rows = [line.split("\t") for line in log.read_text().splitlines() if line.strip()]
    lat = np.sort(np.array([int(r[2]) for r in rows if r[1] == "200"], dtype=np.float64)) / 1000
    failed = sum(1 for r in rows if r[1] != "200")
    took = re.search(r"finished in ([\d.]+)(ms|s)", out)
    elapsed = float(took.group(1)) / (1000 if took.group(2) == "ms" else 1) if took else duration_s
    n = len(lat)
    return {"requests": n, "errors": failed, "throughput_rps": round(n / elapsed, 1),
            "p50_ms": round(float(lat[n // 2]), 3) if n else None,
            "p99_ms": round(float(lat[min(n - 1, int(0.99 * n))]), 3) if n else None,
            "client_cpu_us_per_req": round(cpu / n * 1e6, 1) if n else None}


def segment(target: Target, model: str, proto: str, c: int, bodies: dict[str, Any], args: argparse.Namespace,
            tmp: Path) -> dict[str, Any]:
    """One closed-loop segment; the server's CPU is read around it, Sluice's success count checked."""
    before = sluice_counts(target, model)
    cpu0, t0 = target.cpu_s(), time.perf_counter()
    if proto == "http":
        res = run_wrk(target, model, bodies[model], c, args.duration_s)
    else:
        res = run_h2load(target, model, bodies[model], c, args.duration_s, tmp)
    wall, cpu = time.perf_counter() - t0, target.cpu_s() - cpu0
    n = res["requests"]
    res.update(concurrency=c, server_cpu_us_per_req=round(cpu / n * 1e6, 1) if n else None,
               server_cpu_cores=round(cpu / wall, 2))
    after = sluice_counts(target, model)
    if before and after:
        ok, failed, executions = (a - b for a, b in zip(after, before, strict=True))
        # h2load stops a segment with its last requests in flight (at most one per connection): Sluice
        # counts those cancelled requests as failures, so they are kept apart from the client's errors.
        res["server_failures"] = failed
        res["avg_batch_rows"] = round(ok / executions, 2) if executions else None
    print(f"{model:6s} {proto:4s} {target.name:18s} c={c:<3d} {res['throughput_rps']:>8.1f} req/s "
          f"p50 {res['p50_ms']} ms p99 {res['p99_ms']} ms server {res['server_cpu_us_per_req']} us/req "
          f"client {res['client_cpu_us_per_req']} us/req batch {res.get('avg_batch_rows', '-')} err {res['errors']}",
          flush=True)
    return res


def bench(targets: list[Target], args: argparse.Namespace, bodies: dict[str, Any], tmp: Path) -> list[dict]:
    series = []
    for model in args.models:
        levels = args.ocr_concurrency if model == OCR else args.concurrency
        for proto in ("http", "grpc"):
            for target in targets:
                if model not in target.names or proto not in target.protocols:
                    continue
                results = [segment(target, model, proto, c, bodies, args, tmp) for c in levels]
                series.append({"model": model, "protocol": proto, "target": target.name,
                               "name": f"{target.name}, {proto}", "results": results})
    return series


def parse_args() -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=5.0)
    p.add_argument("--concurrency", type=ints, default=[1, 8, 32, 64])
    p.add_argument("--ocr-concurrency", type=ints, default=[1, 4, 16])
    p.add_argument("--models", type=lambda s: s.split(","), default=["digits", "cnn", OCR])
    p.add_argument("--max-requests", type=int, default=30000, help="for the in-process limit")
    p.add_argument("--tag", default="")
    p.add_argument("--out", type=Path, default=ROOT / "loadtests" / "reports")
    args = p.parse_args()
    if args.duration_s < 1:
        raise SystemExit("--duration-s must be at least 1 (h2load counts whole seconds)")
    return args


def main() -> None:
    args = parse_args()
    for tool in ("wrk", "h2load"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is missing: run scripts/ensure_apt.sh (make apt)")
    root = Path(tempfile.mkdtemp(prefix="sluice-lowcost-"))
    targets: list[Target] = []
    try:
        repo, files, data = build_repo(root)
        ocr_repository(repo)
        page = ocr_page()
        bodies = request_bodies(root, data, page)
        load0 = load_average()
        sluice = start_sluice(root, repo, ROOT)
        batched = sluice.as_target("sluice batched", "dyn")
        batched.names[OCR] = OCR
        targets = [batched, sluice.as_target("sluice unbatched", "nodyn"), start_kserve(root, files), start_null(root)]
        limits = {m: inprocess_limit(files[m], MODELS[m], np.load(data[m]), args) for m in args.models if m != OCR}
        if OCR in args.models:
            limits[OCR] = inprocess_ocr(repo, page, args.ocr_concurrency, args.duration_s)
        series = bench(targets, args, bodies, root)
        report = {
            "benchmark": "classic, low-cost clients (wrk over binary HTTP, h2load over gRPC): Sluice vs KServe "
                         "ModelServer vs the null server vs in-process onnxruntime",
            "clients": {"http": subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split("\n")[0],
                        "grpc": subprocess.run(["h2load", "--version"], capture_output=True,
                                               text=True).stdout.strip()},
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_average_before": load0, "load_average_after": load_average()},
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "inprocess": limits, "series": series, "summary": summarise(series, limits),
        }
        args.out.mkdir(parents=True, exist_ok=True)
        stem = "classic_lowcost" + (f"-{args.tag}" if args.tag else "")
        (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
        plot(report, args.out / f"{stem}.png")
        print(json.dumps(report["summary"], indent=2))
    finally:
        for target in targets:
            target.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
