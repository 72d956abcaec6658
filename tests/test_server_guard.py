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
])
def test_server_command_lines(argv: list[str]) -> None:
    assert starts_server(argv)


@pytest.mark.parametrize("argv", [
    [sys.executable, "-m", "gateway.cli", "launch", "--out", "x"], ["promtool", "check", "rules", "r.yml"],
    ["kubectl", "kustomize", "."], ["openssl", "req"], ["bash", "examples/x.sh"], [],
])
def test_other_command_lines(argv: list[str]) -> None:
    assert not starts_server(argv)


def test_a_test_without_the_mark_cannot_start_one() -> None:
    with pytest.raises(RuntimeError, match="not marked integration"):
        subprocess.Popen(["redis-server", "--port", "1"])
    with pytest.raises(RuntimeError, match="test_a_test_without_the_mark_cannot_start_one"):
        server_guard.check("uvicorn in this process")
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # any other subprocess is fine


@pytest.mark.integration
def test_a_test_with_the_mark_may() -> None:
    server_guard.check("uvicorn in this process")
