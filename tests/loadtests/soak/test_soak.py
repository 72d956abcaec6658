"""loadtests/soak/soak.py as a user runs it: a short smoke soak on a server it starts, and the verdict
on a server that is not there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import ROOT, free_port

pytestmark = pytest.mark.integration

SOAK = ROOT / "loadtests" / "soak" / "soak.py"


def run_soak(out: Path, *args: str, timeout_s: float) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, str(SOAK), "--out", str(out), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s)
    assert out.is_file(), proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.returncode, json.loads(out.read_text())


def test_smoke_soak_loses_and_hangs_nothing(tmp_path: Path) -> None:
    # 8 streams for 18 s with a third of them leaving mid-stream; the drain is generous because
    # the two cores may be shared with other test servers.
    code, report = run_soak(tmp_path / "soak.json", "--streams", "8", "--minutes", "0.3", "--disconnect-rate", "0.3",
                            "--max-tokens", "8", "--drain-s", "120", "--sample-s", "1", timeout_s=420)
    assert code == 0, report
    assert report["passed"] and report["lost"] == 0 and report["hung"] == 0, report
    assert report["completed"] > 0 and report["disconnected"] > 0, report
    assert report["accounted"] == report["sent"] and report["server_alive_and_healthy"]
    assert report["rss"]["measured"] and report["rss"]["warm_baseline_kib"] > 0
    assert len(report["samples"]) >= 10
    assert (tmp_path / "soak.png").stat().st_size > 0


def test_requests_to_a_server_that_is_not_there_are_lost(tmp_path: Path) -> None:
    code, report = run_soak(tmp_path / "down.json", "--url", f"http://127.0.0.1:{free_port()}", "--streams", "2",
                            "--minutes", "0.05", "--drain-s", "5", timeout_s=60)
    assert code == 1 and not report["passed"]
    assert report["lost"] == report["sent"] > 0 and report["completed"] == 0
    assert all(kind.startswith("lost:") for kind in report["errors_by_kind"]), report["errors_by_kind"]
