"""Where the time of one classic request goes: py-spy on a real `sluice serve` under tritonclient load.

For each protocol (gRPC, binary HTTP), single-row requests to the digits MLP (`digits_nodyn`, or
`--model digits_dyn`) run closed loop from `classic_load.py` while py-spy samples the server
(every thread, only samples holding the GIL: the Python CPU time, not waits) for `--seconds`. Written to
loadtests/reports/profiles/:

- `<tag>-<proto>.svg`: the flame graph;
- `<tag>-<proto>.txt`: the collapsed stacks (py-spy's raw format), the input of the summary;
- `<tag>-summary.json`: for each protocol, the share of samples in which a frame matching each
  of a few hot-path patterns is on the stack (inclusive), and the top functions by self time.

    flock /tmp/sluice-bench.lock .venv/bin/python loadtests/profile_classic.py [--tag after]
        [--server-src DIR] [--concurrency 1] [--seconds 8]

py-spy comes from the KServe venv (scripts/ensure_kserve_venv.sh), where it is pinned.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadtests.classic_servers import MODELS, build_repo, kserve_python, start_sluice  # noqa: E402

# Inclusive shares reported for each protocol (a sample counts once per pattern).
PATTERNS = {
    "access control (gateway/security)": "gateway/security/",
    "middleware (gateway/middleware.py)": "gateway/middleware.py",
    "starlette/fastapi routing": "starlette/",
    "uvicorn + httptools protocol": "uvicorn/",
    "KServe HTTP decode/encode (http_infer.py)": "kserve/http_infer.py",
    "KServe gRPC servicer (kserve/grpc.py)": "kserve/grpc.py",
    "gRPC decode/encode (grpc_infer.py)": "kserve/grpc_infer.py",
    "tensor codec (codec.py)": "kserve/codec.py",
    "grpc.aio (grpc/_cython)": "grpc/_cython",
    "manager.infer + validation": "classic/manager.py",
    "scheduler (scheduler.py)": "classic/scheduler.py",
    "batch forming (batching.py)": "classic/batching.py",
    "stack/split (backends/base.py)": "backends/base.py",
    "onnxruntime run": "onnxruntime/",
    "asyncio event loop": "asyncio/",
    "json (stdlib)": "json/",
}


def record(pyspy: Path, pid: int, seconds: float, fmt: str, out: Path) -> None:
    subprocess.run([str(pyspy), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "500",
                    "--format", fmt, "--output", str(out), "--subprocesses", "--nonblocking", "--gil"],
                   check=True, capture_output=True)


def summarise(raw: Path) -> dict:
    total = 0
    inclusive: collections.Counter[str] = collections.Counter()
    self_time: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        for name, pattern in PATTERNS.items():
            if any(pattern in f for f in frames):
                inclusive[name] += n
        self_time[frames[-1]] += n
    return {"samples": total,
            "inclusive_pct": {k: round(100 * v / total, 1) for k, v in inclusive.most_common()} if total else {},
            "top_self_pct": [(k, round(100 * v / total, 1)) for k, v in self_time.most_common(25)] if total else []}


def load(server_url: str, proto: str, model: str, data: Path, threads: int, seconds: float) -> subprocess.Popen:
    spec = MODELS[model.split("_")[0]]
    cmd = [sys.executable, str(ROOT / "loadtests" / "classic_load.py"), "--proto", proto, "--url", server_url,
           "--model", model, "--input", spec["input"], "--output", spec["output"], "--data", str(data),
           "--threads", str(threads), "--duration-s", str(seconds), "--max-requests", "10000000"]
    client = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert client.stdout is not None and client.stdin is not None
    if client.stdout.readline().strip() != "ready":
        raise RuntimeError("the load client failed to start")
    client.stdin.write("go\n")
    client.stdin.flush()
    return client


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tag", default="profile")
    p.add_argument("--model", default="digits_nodyn")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--server-src", type=Path, default=ROOT)
    p.add_argument("--out", type=Path, default=ROOT / "loadtests" / "reports" / "profiles")
    args = p.parse_args()
    pyspy = kserve_python().parent / "py-spy"
    root = Path(tempfile.mkdtemp(prefix="sluice-profile-"))
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"model": args.model, "concurrency": args.concurrency, "server_src": str(args.server_src)}
    server = None
    try:
        repo, _, data = build_repo(root)
        server = start_sluice(root, repo, args.server_src)
        npy = data[args.model.split("_")[0]]
        for proto in ("grpc", "http"):
            url = server.url(proto)
            for fmt, suffix in (("raw", "txt"), ("flamegraph", "svg")):
                client = load(url, proto, args.model, npy, args.concurrency, args.seconds + 4)
                time.sleep(1.0)  # steady state before sampling
                record(pyspy, server.proc.pid, args.seconds, fmt, args.out / f"{args.tag}-{proto}.{suffix}")
                out, _ = client.communicate(timeout=60)
                stats = json.loads(out.strip().splitlines()[-1])
                if fmt == "raw":
                    summary[proto] = {"requests_per_s": round(len(stats["latencies"]) / stats["elapsed_s"], 1),
                                      **summarise(args.out / f"{args.tag}-{proto}.txt")}
        (args.out / f"{args.tag}-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps({k: v.get("inclusive_pct", v) if isinstance(v, dict) else v for k, v in summary.items()},
                         indent=2))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
