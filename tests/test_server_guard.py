"""The rule that only tests marked `integration` start servers (tests/server_guard.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import server_guard
from tests.server_guard import starts_server


@pytest.mark.parametrize("argv", [
    [sys.executable, "-m", "gateway.cli", "serve", "--http-port", "1"],
    [sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim"],
    [sys.executable, "-m", "engines.launchers", "--engine", "vllm"],
    [sys.executable, "-m", "engines.sim", "--port", "1"],
    [sys.executable, "/work/tests/standins/trtllm_standin.py", "--port", "1"],
    ["redis-server", "--port", "1"], ["/usr/bin/prometheus"], ["node", "driver.js"], ["uvicorn", "app:app"],
    ["sluice", "serve", "--http-port", "1"], ["/venv/bin/sluice", "worker", "--engine", "sim"],
    # What subprocess.Popen(..., shell=True) hands the audit hook.
    ["/bin/sh", "-c", "redis-server --port 1"], ["/bin/sh", "-c", "cd /tmp && exec redis-server --port 1"],
    ["bash", "-c", "X=1 sluice serve --http-port 1 > log 2>&1"], ["bash", "-ec", "true; node 'driver one.js' &"],
    ["sh", "-c", f"{sys.executable} -m gateway.cli worker --engine sim"], ["sh", "-c", "bash -c 'uvicorn app:app'"],
])
def test_server_command_lines(argv: list[str]) -> None:
    assert starts_server(argv)


@pytest.mark.parametrize("argv", [
    [sys.executable, "-m", "gateway.cli", "launch", "--out", "x"], ["promtool", "check", "rules", "r.yml"],
    ["kubectl", "kustomize", "."], ["openssl", "req"], ["bash", "examples/x.sh"], [],
    # Only the subcommand, the token right after gateway.cli or sluice, decides.
    [sys.executable, "-m", "gateway.cli", "launch", "--name", "worker"], [sys.executable, "-m", "gateway.cli"],
    ["sluice", "launch", "--name", "serve"], ["sluice"],
    ["/bin/sh", "-c", "promtool check rules r.yml && echo redis-server"], ["/bin/sh", "-c", "echo 'unbalanced"],
    ["bash", "examples/x.sh", "-c", "redis-server"], ["sh", "-c"],
])
def test_other_command_lines(argv: list[str]) -> None:
    assert not starts_server(argv)


def test_a_test_without_the_mark_cannot_start_one() -> None:
    with pytest.raises(RuntimeError, match="not marked integration"):
        subprocess.Popen(["redis-server", "--port", "1"])
    with pytest.raises(RuntimeError, match="test_a_test_without_the_mark_cannot_start_one"):
        server_guard.check("uvicorn in this process")
    with pytest.raises(RuntimeError, match="not marked integration"):
        subprocess.Popen("redis-server --port 1", shell=True)
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # any other subprocess is fine
    subprocess.run("true", shell=True, check=True)


@pytest.mark.integration
def test_a_test_with_the_mark_may() -> None:
    server_guard.check("uvicorn in this process")
