"""Processes the relay and live-routing benchmarks start: sim fleets, `sluice serve`, vllm-router.

Each runs in its own session (process group), logs to a file shown when something fails, and is
stopped by `stop` (SIGTERM to the group, then SIGKILL). `cpu_s(proc)` is the CPU time the group
used so far, from /proc, so a benchmark can say what each process spent per relayed token.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


_PORT_RNG = random.SystemRandom()


def free_ports(n: int, span: int = 1) -> list[int]:
    """`n` base ports, each with `span` consecutive free ports after it (fleets use a range)."""
    out: list[int] = []
    rng = _PORT_RNG  # one generator per process: two calls in the same second must not pick the same ports
    while len(out) < n:
        base = rng.randrange(20000, 60000 - span)
        ok = True
        for p in range(base, base + span):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok and all(abs(base - b) > span for b in out):
            out.append(base)
    return out


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)


def wait_ok(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 180.0, path: str = "/health") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url}{path} not ready after {timeout_s:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT (`sluice serve` then skips its drain), SIGTERM, then SIGKILL, to the whole group."""
    for sig, wait_s in ((signal.SIGINT, 10.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def cpu_s(proc: subprocess.Popen[bytes]) -> float:
    """User + system CPU seconds of every live process in `proc`'s group."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == proc.pid:  # field 5 of stat, the process group
            total += int(fields[11]) + int(fields[12])
    return total * _TICK_S


def sim_fleet(port: int, log: Path, *, replicas: int = 1, profile: str = "zero", extra: list[str] | None = None,
              src: Path = ROOT) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim", "--model", MODEL, "--port", str(port),
            "--replicas", str(replicas), "--profile", profile, "--model-repository",
            str(ROOT / "model_repository"), "--log-level", "warning", *(extra or [])]
    return spawn(argv, log, cwd=src)


def gateway_repository(scratch: Path) -> Path:
    """A repository with only the LLM's config: the gateway finds the tokenizer and loads nothing else."""
    repo = scratch / "repo"
    if not repo.exists():
        repo.mkdir(parents=True)
        shutil.copytree(ROOT / "model_repository" / MODEL, repo / MODEL)
    return repo


def sluice(port: int, workers_file: Path, log: Path, *, src: Path = ROOT, extra: list[str] | None = None
           ) -> subprocess.Popen[bytes]:
    """`sluice serve` from the source tree `src` (another tree: the code before a change)."""
    env = dict(os.environ, PYTHONPATH=str(src))
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--http-port", str(port),
            "--grpc-port", "0", "--model-repository", str(gateway_repository(log.parent)), "--workers-file",
            str(workers_file), "--max-running", "4096", "--max-queued", "4096", "--log-level", "warning",
            *(extra or [])]
    return spawn(argv, log, env=env, cwd=src)


def workers_file(path: Path, ports: list[int], kv_base: int | None, names: list[str] | None = None,
                 block_size: int = 128) -> Path:
    """A --workers-file for sim workers on `ports` (KV events at kv_base + 2i when given)."""
    lines = []
    for i, p in enumerate(ports):
        name = names[i] if names else f"sim-{p}"
        lines.append(f"- name: {name}\n  url: http://127.0.0.1:{p}\n  engine: sim\n  models: [{MODEL}]\n"
                     f"  tokenizer: {MODEL}\n  block_size: {block_size}")
        if kv_base is not None:
            lines.append(f"  kv_events_endpoint: tcp://127.0.0.1:{kv_base + 2 * i}\n"
                         f"  kv_events_replay_endpoint: tcp://127.0.0.1:{kv_base + 2 * i + 1}")
    path.write_text("\n".join(lines) + "\n")
    return path


def tools_venv() -> Path:
    out = subprocess.run([str(ROOT / "scripts" / "ensure_bench_tools_venv.sh")], check=True, capture_output=True,
                         text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def vllm_router(port: int, worker_urls: list[str], policy: str, log: Path, extra: list[str] | None = None
                ) -> subprocess.Popen[bytes]:
    venv = tools_venv()
    metrics_port = free_ports(1)[0]  # its Prometheus exporter binds one too (default 29000: clashes)
    argv = [str(venv / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--worker-urls", *worker_urls, "--log-level", "warning", "--max-concurrent-requests", "8192",
            "--disable-retries", "--health-check-interval-secs", "30", *(extra or [])]
    return spawn(argv, log)


def tail_logs(scratch: Path) -> None:
    for log in sorted(scratch.glob("*.log")):
        print(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)


def wait_quiet(max_load: float, timeout_s: float) -> float:
    """Wait (bounded) until the 1-minute load average is below `max_load`; returns it."""
    deadline = time.monotonic() + timeout_s
    while os.getloadavg()[0] > max_load and time.monotonic() < deadline:
        time.sleep(2.0)
    return os.getloadavg()[0]
