"""The classic benchmark's servers and the in-process limit (used by bench_servers.py and profile_sluice.py).

- `build_repo(root)`: a repository with each model twice, dynamic batching on (`<model>_dyn`)
  and off (`<model>_nodyn`); the ONNX files; the single-row inputs as .npy.
- `start_sluice(...)`: the real `sluice serve` from a given checkout; `start_kserve(...)`: KServe's
  ModelServer (loadtests/classic/kserve_peer.py in the KServe venv) on the same ONNX files.
- `Target`: what a segment needs from a server: its URLs, the model's name there, the CPU
  seconds of its process tree, and (Sluice) the rows and executions from its statistics.
- `inprocess_limit(...)`: onnxruntime alone, by concurrency and by batch size.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.servers import free_port

CACHE = Path(os.environ.get("SLUICE_CACHE", Path.home() / ".cache" / "sluice"))
REPO_SRC = ROOT / "model_repository"
DYN = "dynamic_batching { max_queue_delay_microseconds: 500 }"
MODELS: dict[str, dict[str, Any]] = {
    "digits": {"source": "digits_onnx", "input": "input", "output": "probabilities", "shape": [64],
               "config": "dynamic_batching { max_queue_delay_microseconds: 2000 }"},
    "cnn": {"source": "digits_cnn", "input": "image", "output": "logits", "shape": [1, 32, 32],
            "config": "dynamic_batching { max_queue_delay_microseconds: 2000 }"},
}
_TICK = os.sysconf("SC_CLK_TCK")


def build_repo(root: Path) -> tuple[Path, dict[str, Path], dict[str, Path]]:
    from sklearn.datasets import load_digits

    from model_repository.classic_build import build_all, cnn_artifacts
    from model_repository.cnn_build import digits_32

    repo = root / "repo"
    build_all(root / "built", CACHE)
    files = {"digits": root / "built" / "digits_onnx" / "1" / "model.onnx", "cnn": cnn_artifacts(CACHE)["model.onnx"]}
    for model, spec in MODELS.items():
        base = (REPO_SRC / spec["source"] / "config.pbtxt").read_text()
        for suffix, batching in (("dyn", DYN), ("nodyn", "")):
            name = f"{model}_{suffix}"
            config = base.replace(f'name: "{spec["source"]}"', f'name: "{name}"').replace(spec["config"], batching)
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "config.pbtxt").write_text(config)
            shutil.copyfile(files[model], repo / name / "1" / "model.onnx")
    data = {"digits": root / "digits.npy", "cnn": root / "cnn.npy"}
    np.save(data["digits"], (load_digits().data / 16.0).astype(np.float32))
    np.save(data["cnn"], digits_32()[0])
    return repo, files, data


def tree_cpu_s(pid: int) -> float:
    """utime + stime (all threads) of `pid` and every process below it, in seconds."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / _TICK
    total, stack = 0.0, [pid]
    while stack:
        p = stack.pop()
        total += cpu.get(p, 0.0)
        stack += children.get(p, [])
    return total


@dataclass
class Target:
    name: str
    http: str
    grpc: str
    proc: subprocess.Popen
    names: dict[str, str]  # benchmark model -> the model's name on this server
    stats_url: str | None = None
    owner: bool = True  # stop() ends the process
    extra: list[Target] = field(default_factory=list)
    protocols: tuple[str, ...] = ("grpc", "http")  # the ones this target is measured on

    def url(self, proto: str) -> str:
        return self.grpc if proto == "grpc" else self.http

    def model_name(self, model: str) -> str:
        return self.names[model]

    def cpu_s(self) -> float:
        return tree_cpu_s(self.proc.pid)

    def batch_stats(self, model: str) -> tuple[int, int] | None:
        if self.stats_url is None:
            return None
        s = httpx.get(f"http://{self.http}/v2/models/{self.names[model]}/stats").json()["model_stats"][0]
        return int(s["inference_count"]), int(s["execution_count"])

    def as_target(self, name: str, suffix: str) -> Target:
        return Target(name, self.http, self.grpc, self.proc, {m: f"{m}_{suffix}" for m in MODELS}, self.stats_url,
                      owner=suffix == "dyn")

    def stop(self) -> None:
        if self.owner and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _wait(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"server not ready: {log.read_text()[-3000:]}")


def start_sluice(root: Path, repo: Path, src: Path, frontends: int = 1, *extra: str) -> Target:
    http_port, grpc_port = free_port(), free_port()
    log = root / "sluice.log"
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--http-port", str(http_port),
           "--grpc-port", str(grpc_port), "--model-repository", str(repo), "--log-level", "warning", *extra]
    if frontends != 1:
        cmd += ["--frontends", str(frontends)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=src, stdout=out, stderr=subprocess.STDOUT, env=env)
    _wait(f"http://127.0.0.1:{http_port}/v2/health/ready", proc, log)
    return Target("sluice", f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", proc, {}, "stats")


def kserve_python() -> Path:
    venv = subprocess.run([str(ROOT / "scripts" / "ensure_kserve_venv.sh")], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    return Path(venv) / "bin" / "python"


def start_kserve(root: Path, files: dict[str, Path], workers: int = 1) -> Target:
    """KServe's ModelServer; `workers` > 1 is its own multi-process REST server (`--workers`),
    measured over HTTP only: its gRPC server stays in the main process."""
    http_port, grpc_port = free_port(), free_port()
    log = root / f"kserve-{workers}.log"
    cmd = [str(kserve_python()), str(ROOT / "loadtests" / "classic" / "kserve_peer.py"), "--http_port", str(http_port),
           "--grpc_port", str(grpc_port), "--workers", str(workers)]
    for model, path in files.items():
        cmd += ["--model", f"{model}={path}"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, stdout=out, stderr=subprocess.STDOUT)
    _wait(f"http://127.0.0.1:{http_port}/v2/health/ready", proc, log)
    if workers == 1:
        return Target("kserve", f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", proc, {m: m for m in files})
    return Target(f"kserve, {workers} workers", f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", proc,
                  {m: m for m in files}, protocols=("http",))


def start_null(root: Path, processes: int = 1) -> Target:
    """`null_server.py`: the protocol libraries alone, the floor of any server built on them."""
    http_port, grpc_port = free_port(), free_port()
    log = root / f"null-{processes}.log"
    cmd = [sys.executable, str(ROOT / "loadtests" / "classic" / "null_server.py"), "--http-port", str(http_port),
           "--grpc-port", str(grpc_port), "--processes", str(processes)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    _wait(f"http://127.0.0.1:{http_port}/v2/health/ready", proc, log)
    name = "null server" + (f", {processes} processes" if processes > 1 else "")
    return Target(name, f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", proc, {m: m for m in MODELS})


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def threaded_latencies(call: Callable[[int], object], threads: int, duration_s: float,
                       max_calls: int | None = None) -> tuple[np.ndarray, float]:
    """`call(n)` from `threads` threads in a closed loop for `duration_s` (at most `max_calls` in all);
    thread i passes n = i, i + 1, ... Returns the sorted latencies (s) and the elapsed time (s)."""
    done, lat = [0], [[] for _ in range(threads)]
    deadline = time.perf_counter() + duration_s

    def loop(i: int) -> None:
        n = i
        while time.perf_counter() < deadline and (max_calls is None or done[0] < max_calls):
            t0 = time.perf_counter()
            call(n)
            lat[i].append(time.perf_counter() - t0)
            done[0] += 1
            n += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return np.sort(np.concatenate([np.asarray(x) for x in lat])), time.perf_counter() - t0


def inprocess_limit(path: Path, spec: dict[str, Any], xs: np.ndarray, args: Any) -> dict[str, Any]:
    """onnxruntime alone: one session with one thread; single rows from N threads, and rows/s by batch size."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed, out = spec["input"], [spec["output"]]
    by_concurrency = []
    for c in args.concurrency:
        lat, elapsed = threaded_latencies(lambda n: session.run(out, {feed: xs[n % len(xs)][None]}), c,
                                          min(args.duration_s, 2.0), args.max_requests)
        by_concurrency.append({"concurrency": c, "throughput_rps": round(len(lat) / elapsed, 1),
                               "p50_ms": round(float(lat[len(lat) // 2]) * 1000, 4)})
    by_batch = []
    for bs in (1, 2, 4, 8, 16, 32, 64):
        batch = np.ascontiguousarray(np.resize(xs, (bs, *xs.shape[1:])))
        session.run(out, {feed: batch})
        best = 0.0
        for _ in range(3):  # best of three: noise only slows it down
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 0.3:
                session.run(out, {feed: batch})
                n += 1
            best = max(best, n * bs / (time.perf_counter() - t0))
        by_batch.append({"batch_size": bs, "rows_per_s": round(best, 1)})
    print(f"in-process {path.name}: by concurrency {by_concurrency}; by batch size {by_batch}", flush=True)
    return {"by_concurrency": by_concurrency, "by_batch_size": by_batch}
