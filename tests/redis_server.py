"""A throw-away redis-server on loopback for tests: no persistence, so a restart comes back empty."""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Any

import redis

from tests.servers import free_port

HAVE_REDIS = shutil.which("redis-server") is not None


class RedisServer:
    """`args` are extra redis-server options (ACL users, TLS); `client_kwargs` what a client
    then needs (username and password, ssl and its CA). With `tls`, `port` is the TLS port."""

    def __init__(self, args: tuple[str, ...] = (), client_kwargs: dict[str, Any] | None = None,
                 tls: bool = False) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.args = args
        self.client_kwargs = client_kwargs or {}
        self.tls = tls

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start (or restart, on the same port) and wait until it answers PING."""
        ports = ["--port", "0", "--tls-port", str(self.port)] if self.tls else ["--port", str(self.port)]
        self.proc = subprocess.Popen(
            ["redis-server", *ports, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2, **self.client_kwargs)
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
        return redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1, socket_timeout=1,
                           **self.client_kwargs)
