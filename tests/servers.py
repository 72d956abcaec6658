"""Start real Sluice servers (uvicorn in a subprocess) for tests."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REPO = ROOT / "model_repository"
LLM_NAME = "smollm2-135m-instruct"


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A free loopback port outside the kernel's ephemeral range.

    Servers that tests stop and restart (Redis, workers) are reconnected to while
    they are down. A port inside the ephemeral range can then be picked as the
    client's own source port, and the socket connects to itself (TCP simultaneous
    open): the client talks to itself and hangs. Ports below the range never are.
    """
    low, high = _ephemeral_range()
    candidates = list(range(10000, low)) if low > 10100 else list(range(high + 1, 65500))
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port outside the ephemeral range")


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def llm_only_repository(tmp: Path) -> Path:
    """A repository holding just the default LLM (faster start, no classic models)."""
    repo = tmp / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    shutil.copytree(DEFAULT_REPO / LLM_NAME, repo / LLM_NAME, dirs_exist_ok=True)
    return repo


def start_server(args: list[str], log_path: Path, *, env: dict[str, str] | None = None,
                 grpc: bool = False, ready_timeout_s: float = 240.0, wait: bool = True,
                 preexec_fn: Callable[[], None] | None = None, http_port: int | None = None) -> Server:
    """`sluice serve` in a subprocess; with `wait`, returns once /health answers 200,
    else once the HTTP port answers at all (models may still be loading). `preexec_fn` runs in
    the child before it starts (e.g. to lower its soft fd limit); `http_port` reuses a port (a
    restart), else a free one is picked."""
    http_port = http_port or free_port()
    grpc_port = free_port() if grpc else 0
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1",
           "--http-port", str(http_port), "--grpc-port", str(grpc_port), *args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    log = log_path.open("wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                            preexec_fn=preexec_fn)
    server = Server(proc, http_port, grpc_port, log_path)
    wait_healthy(server, ready_timeout_s, any_status=not wait)
    return server


def wait_health(url: str, status: int, timeout_s: float) -> None:
    """Until `url`/health answers `status` (an in-process gateway, which has no process to watch)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == status:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"/health never answered {status} within {timeout_s} s")


def wait_healthy(server: Server, timeout_s: float, *, any_status: bool = False) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log()[-4000:]}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200 or any_status:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"server not healthy after {timeout_s}s:\n{server.log()[-4000:]}")


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The value of one sample in Prometheus text format (None when absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric != name:
            continue
        if labels and any(f'{k}="{v}"' not in label_text for k, v in labels.items()):
            continue
        return float(value)
    return None


def until(check: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    """Poll `check` until it is true; a bounded wait for an event, not a speed bound (a miss names
    what never happened)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"never happened within {timeout_s:.0f} s: {what}")
