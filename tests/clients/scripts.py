"""Running examples/ as a user would: a subprocess with the server's URL in the environment."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.servers import ROOT

EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, env: dict[str, str] | None = None, timeout_s: float = 300) -> str:
    """The example's stdout; fails the test with its output if it exits non-zero."""
    cmd = ["bash", str(EXAMPLES / name)] if name.endswith(".sh") else [sys.executable, str(EXAMPLES / name)]
    out = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout_s,
                         env={**os.environ, **(env or {})}, cwd=ROOT)
    assert out.returncode == 0, f"{name} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout
