"""Where the time of one classic request goes: py-spy on a real `sluice serve` under tritonclient load.

For each protocol (gRPC, binary HTTP), single-row requests to the digits MLP (`digits_nodyn`, or
`--model digits_dyn`) run closed loop from `load_client.py` while py-spy samples the server
(every thread, only samples holding the GIL: the Python CPU time, not waits) for `--seconds`. Written to
loadtests/reports/profiles/:

- `<tag>-<proto>.svg`: the flame graph;
- `<tag>-<proto>.txt`: the collapsed stacks (py-spy's raw format), the input of the summary;
- `<tag>-summary.json`: for each protocol, the server's CPU per request, the share of samples
  by the innermost Sluice module on the stack (library time counts for the Sluice code that
  called it; samples with no Sluice frame count for their library), and the top functions by
  self time.

    flock /tmp/sluice-bench.lock .venv/bin/python loadtests/classic/profile_sluice.py [--tag after]
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadtests.classic.servers import MODELS, build_repo, kserve_python, start_sluice, tree_cpu_s

# Libraries, for samples with no Sluice frame on the stack (matched from the innermost frame out).
LIBRARIES = {"grpc/": "grpc.aio (cython)", "uvicorn/": "uvicorn + httptools", "starlette/": "starlette/fastapi",
             "fastapi/": "starlette/fastapi", "onnxruntime/": "onnxruntime", "asyncio/": "asyncio",
             "prometheus_client/": "prometheus_client", "logging/": "logging", "json/": "json (stdlib)",
             "numpy/": "numpy", "google/": "protobuf", "threading.py": "threading", "queue.py": "queue"}


def category(frames: list[str]) -> str:
    """The innermost frame on the stack that is Sluice code (by module) or a known library: where the
    sample's time is spent. asyncio and threading count only when nothing else is on the stack, and
    what is left is the event loop itself (uvloop runs in C below `Runner.run`)."""
    fallback = "event loop / other"
    for frame in reversed(frames):
        where = frame.rpartition("(")[2]
        if where.startswith(("gateway/", "engines/")) and not where.startswith("gateway/http/server.py"):
            return where.partition(":")[0]
        for pattern, name in LIBRARIES.items():
            if pattern in frame:
                if name not in ("asyncio", "threading"):
                    return name
                fallback = name if fallback == "event loop / other" else fallback
    return fallback


def record(pyspy: Path, pid: int, seconds: float, fmt: str, out: Path) -> None:
    subprocess.run([str(pyspy), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "500",
                    "--format", fmt, "--output", str(out), "--subprocesses", "--nonblocking", "--gil"],
                   check=True, capture_output=True)


def summarise(raw: Path) -> dict:
    total = 0
    by_category: collections.Counter[str] = collections.Counter()
    self_time: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")[1:]  # the first is the process
        by_category[category(frames)] += n
        self_time[frames[-1] if frames else "?"] += n
    if not total:
        return {"samples": 0}
    return {"samples": total,
            "by_sluice_module_pct": {k: round(100 * v / total, 1) for k, v in by_category.most_common()},
            "top_self_pct": [(k, round(100 * v / total, 1)) for k, v in self_time.most_common(25)]}


def load(server_url: str, proto: str, model: str, data: Path, threads: int, seconds: float) -> subprocess.Popen:
    spec = MODELS[model.split("_")[0]]
    cmd = [sys.executable, str(ROOT / "loadtests" / "classic" / "load_client.py"), "--proto", proto,
           "--url", server_url,
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
                cpu0 = tree_cpu_s(server.proc.pid)
                time.sleep(1.0)  # steady state before sampling
                record(pyspy, server.proc.pid, args.seconds, fmt, args.out / f"{args.tag}-{proto}.{suffix}")
                out, _ = client.communicate(timeout=60)
                cpu = tree_cpu_s(server.proc.pid) - cpu0
                stats = json.loads(out.strip().splitlines()[-1])
                if fmt == "raw":
                    n = len(stats["latencies"])
                    summary[proto] = {"requests_per_s": round(n / stats["elapsed_s"], 1),
                                      "server_cpu_us_per_req": round(cpu / n * 1e6, 1),
                                      **summarise(args.out / f"{args.tag}-{proto}.txt")}
        (args.out / f"{args.tag}-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps({k: v.get("by_sluice_module_pct", v) if isinstance(v, dict) else v
                          for k, v in summary.items()}, indent=2))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
