"""Classic-path benchmark: digits ONNX over KServe gRPC and binary HTTP, with and without dynamic batching,
next to in-process onnxruntime (the limit), at concurrency 1, 8 and 32, in one run.

Starts a real `sluice serve` on loopback with a temporary repository holding two
copies of digits_onnx (dynamic batching on / off). Every client sends single-row
requests. Loops are bounded by request count and by time.

    .venv/bin/python loadtests/bench_classic.py [--duration-s 3] [--max-requests 4000]

Writes loadtests/reports/classic.json and loadtests/reports/classic.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.kserve_support import CACHE, REPO_SRC, Server, _wait_ready, free_port

CONCURRENCY = (1, 8, 32)
DYN = "dynamic_batching { max_queue_delay_microseconds: 500 }"


def build_repo(root: Path) -> Path:
    from model_repository.classic_build import build_all

    repo = root / "repo"
    base = (REPO_SRC / "digits_onnx" / "config.pbtxt").read_text()
    for name, batching in (("digits_dyn", DYN), ("digits_nodyn", "")):
        config = base.replace('name: "digits_onnx"', f'name: "{name}"')
        config = config.replace("dynamic_batching { max_queue_delay_microseconds: 2000 }", batching)
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
    build_all(root / "built", CACHE)  # builds/links digits_onnx/1/model.onnx under root/built
    for name in ("digits_dyn", "digits_nodyn"):
        shutil.copyfile(root / "built" / "digits_onnx" / "1" / "model.onnx", repo / name / "1" / "model.onnx")
    return repo


def start_server(root: Path, repo: Path) -> Server:
    import subprocess

    http_port, grpc_port = free_port(), free_port()
    log_path = root / "server.log"
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--http-port", str(http_port),
           "--grpc-port", str(grpc_port), "--model-repository", str(repo), "--log-level", "warning"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    server = Server(root, repo, http_port, grpc_port, proc, log_path)
    _wait_ready(server)
    return server


def grpc_caller(server: Server, model: str) -> Callable[[], Callable[[np.ndarray], None]]:
    def make() -> Callable[[np.ndarray], None]:
        import tritonclient.grpc as g

        client = g.InferenceServerClient(server.grpc_url)

        def call(x: np.ndarray) -> None:
            inp = g.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            client.infer(model, [inp], outputs=[g.InferRequestedOutput("probabilities")])
        return call
    return make


def http_caller(server: Server, model: str) -> Callable[[], Callable[[np.ndarray], None]]:
    def make() -> Callable[[np.ndarray], None]:
        import tritonclient.http as h

        client = h.InferenceServerClient(server.http_url)

        def call(x: np.ndarray) -> None:
            inp = h.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            client.infer(model, [inp], outputs=[h.InferRequestedOutput("probabilities", binary_data=True)])
        return call
    return make


def inprocess_caller(model_path: Path) -> Callable[[], Callable[[np.ndarray], None]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])

    def make() -> Callable[[np.ndarray], None]:
        return lambda x: session.run(["probabilities"], {"input": x})
    return make


def run_load(make: Callable[[], Callable[[np.ndarray], None]], concurrency: int, xs: np.ndarray,
             duration_s: float, max_requests: int) -> dict:
    """`concurrency` closed-loop clients; stops at max_requests in total or after duration_s."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    budget = threading.Semaphore(max_requests)
    callers = [make() for _ in range(concurrency)]
    for call in callers:  # warm-up: connections and sessions
        call(xs[:1])
    deadline = time.perf_counter() + duration_s
    start = time.perf_counter()

    def worker(i: int) -> None:
        call = callers[i]
        n = 0
        while time.perf_counter() < deadline and budget.acquire(blocking=False):
            x = xs[(i * 97 + n) % len(xs)][None, :]
            t0 = time.perf_counter()
            try:
                call(x)
            except Exception:
                errors[i] += 1
                continue
            latencies[i].append(time.perf_counter() - t0)
            n += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    lat = sorted(x for per in latencies for x in per)
    return {
        "concurrency": concurrency, "requests": len(lat), "errors": sum(errors), "elapsed_s": round(elapsed, 3),
        "throughput_rps": round(len(lat) / elapsed, 1),
        "p50_ms": round(statistics.median(lat) * 1000, 3) if lat else None,
        "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000, 3) if lat else None,
    }


def stats_of(server: Server, model: str) -> dict:
    import httpx

    s = httpx.get(f"http://{server.http_url}/v2/models/{model}/stats").json()["model_stats"][0]
    return {"inference_count": s["inference_count"], "execution_count": s["execution_count"]}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for series in report["series"]:
        xs = [r["concurrency"] for r in series["results"]]
        ax1.plot(xs, [r["throughput_rps"] for r in series["results"]], marker="o", label=series["name"])
        ax2.plot(xs, [r["p50_ms"] for r in series["results"]], marker="o", label=series["name"])
    ax1.set(xlabel="concurrency", ylabel="requests / s", title="digits ONNX throughput (1 row/request)",
            xscale="log", yscale="log")
    ax2.set(xlabel="concurrency", ylabel="p50 latency (ms)", title="p50 latency", xscale="log", yscale="log")
    for ax in (ax1, ax2):
        ax.set_xticks(list(CONCURRENCY), [str(c) for c in CONCURRENCY])
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration-s", type=float, default=3.0)
    parser.add_argument("--max-requests", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=ROOT / "loadtests" / "reports")
    args = parser.parse_args()
    if args.duration_s <= 0 or args.max_requests <= 0:
        raise SystemExit("--duration-s and --max-requests must be positive")

    from sklearn.datasets import load_digits

    xs = (load_digits().data / 16.0).astype(np.float32)
    root = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    server = None
    try:
        repo = build_repo(root)
        server = start_server(root, repo)
        plans = [("in-process onnxruntime", inprocess_caller(repo / "digits_nodyn" / "1" / "model.onnx"), None)]
        for proto, caller in (("grpc", grpc_caller), ("http-binary", http_caller)):
            for model, label in (("digits_dyn", "dynamic batching"), ("digits_nodyn", "no batching")):
                plans.append((f"{proto}, {label}", caller(server, model), model))
        series = []
        for name, make, model in plans:
            results = []
            for c in CONCURRENCY:
                before = stats_of(server, model) if model else None
                result = run_load(make, c, xs, args.duration_s, args.max_requests)
                if model:
                    after = stats_of(server, model)
                    inf = after["inference_count"] - before["inference_count"]
                    exe = after["execution_count"] - before["execution_count"]
                    result["avg_batch_rows"] = round(inf / exe, 2) if exe else None
                results.append(result)
                print(f"{name:38s} c={c:<3d} {result['throughput_rps']:>8.1f} req/s  p50 {result['p50_ms']} ms  "
                      f"p99 {result['p99_ms']} ms  batch {result.get('avg_batch_rows', '-')}", flush=True)
            series.append({"name": name, "model": model, "results": results})
        report = {
            "benchmark": "classic digits_onnx",
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "settings": {"duration_s": args.duration_s, "max_requests": args.max_requests,
                         "rows_per_request": 1, "dynamic_batching": DYN, "instances": 1},
            "series": series, "summary": summarise(series),
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "classic.json").write_text(json.dumps(report, indent=2) + "\n")
        plot(report, args.out / "classic.png")
        print(json.dumps(report["summary"], indent=2))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


def summarise(series: list[dict]) -> dict:
    by = {s["name"]: {r["concurrency"]: r for r in s["results"]} for s in series}
    base = by["in-process onnxruntime"][1]["p50_ms"]
    out: dict = {}
    for proto in ("grpc", "http-binary"):
        dyn, nodyn = by[f"{proto}, dynamic batching"], by[f"{proto}, no batching"]
        out[proto] = {
            "batching_gain_at_32": round(dyn[32]["throughput_rps"] / nodyn[32]["throughput_rps"], 2),
            "overhead_p50_ms_at_1": round(nodyn[1]["p50_ms"] - base, 3),
        }
    return out


if __name__ == "__main__":
    main()
