"""A throw-away redis-server on loopback for tests: no persistence, so a restart comes back empty."""

from __future__ import annotations

import shutil
import subprocess
import time

import redis

from tests.servers import free_port

HAVE_REDIS = shutil.which("redis-server") is not None


class RedisServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start (or restart, on the same port) and wait until it answers PING."""
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        for _ in range(400):  # bounded wait for readiness
            try:
                if client.ping():
                    return self
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited at start-up")
            time.sleep(0.025)
        raise RuntimeError("redis-server did not become ready")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=1)
