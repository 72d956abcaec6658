"""The mixed box: unrelated models served together by one Sluice, and one model's burst measured
against the others' latency, without and with Triton's rate limiter, in one run.

Models: `fraud_gb` (gradient boosting on an imbalanced set), `recommender` (matrix factorisation,
top 10 of 5,000 items; loadtests/classic/mixed_models.py), `digits_cnn` (the image classifier) and
the OCR pipeline (`ocr` and its steps, from the default repository).

Load: steady open-loop traffic on fraud_gb, recommender and digits_cnn (`--rates`, requests per
second each, sent on schedule whatever the answers, from one client process over binary HTTP), for
`--window-s`; in its middle, a burst of `--burst-s` on `ocr`, closed loop at `--burst-c` connections,
driven by wrk. Each server runs the same load, one after the other:

- `no limiter`: the configs as they are;
- `rate limiter`: `--rate-limit execution_count --rate-limit-resource heavy:1`, and every OCR network's
  instance group asks for one `heavy`: one OCR execution at a time, so the other models keep a core.

Per model and phase (before, during, after the burst): p50/p99 latency at the client, failures, and
the queue time from the model's own statistics; and the OCR burst's throughput. Instance-group
placement (instances per model, threads) is written into the report.

    flock /tmp/sluice-bench.lock .venv/bin/python loadtests/classic/bench_mixed_box.py [--window-s 30]
        [--burst-s 14] [--burst-c 8] [--rates 40,40,20]

Writes loadtests/reports/mixed_box.json and .png. Only 127.0.0.1 is targeted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadtests.classic.lowcost_support import ocr_page
from loadtests.classic.mixed_models import build_fraud, build_recommender
from loadtests.classic.servers import Target, load_average, start_sluice
from tests.integration.ocr_support import OCR_MODELS, ocr_repository

STEADY = ("fraud_gb", "recommender", "digits_cnn")
HEAVY = ("ocr_det", "ocr_cls", "ocr_rec")
LUA = ROOT / "loadtests" / "classic" / "kserve_binary.lua"


def build_repo(root: Path) -> tuple[Path, dict[str, np.ndarray]]:
    from model_repository.classic_build import cnn_artifacts
    from model_repository.cnn_build import digits_32

    repo = root / "repo"
    repo.mkdir()
    rows = {"fraud_gb": build_fraud(repo)}
    build_recommender(repo)
    rows["recommender"] = np.arange(64, dtype=np.int64).reshape(-1, 1)
    shutil.copytree(ROOT / "model_repository" / "digits_cnn", repo / "digits_cnn",
                    ignore=shutil.ignore_patterns("*.onnx"))
    shutil.copyfile(cnn_artifacts(Path(os.environ.get("SLUICE_CACHE", Path.home() / ".cache" / "sluice")))
                    ["model.onnx"], repo / "digits_cnn" / "1" / "model.onnx")
    rows["digits_cnn"] = np.ascontiguousarray(digits_32()[0][:64])
    ocr_repository(repo)
    return repo, rows


def limited_copy(repo: Path, root: Path) -> Path:
    """The same repository, every OCR network's instance group asking for one `heavy`."""
    out = root / "repo-limited"
    shutil.copytree(repo, out)
    for name in HEAVY:
        config = out / name / "config.pbtxt"
        text, n = re.subn(r"kind: KIND_CPU \}",
                          'kind: KIND_CPU, rate_limiter { resources [ { name: "heavy", count: 1 } ] } }',
                          config.read_text())
        assert n == 1, f"{name}: no instance_group to limit"
        config.write_text(text)
    return out


def placement(repo: Path) -> dict[str, str]:
    """Each model's instance groups, as its config says."""
    out = {}
    for config in sorted(repo.glob("*/config.pbtxt")):
        found = re.findall(r"instance_group \[(.*?)\]\s*$", config.read_text(), re.S | re.M)
        out[config.parent.name] = " ".join(found[0].split()) if found else "1 instance (default)"
    return out


def _bodies(rows: dict[str, np.ndarray]) -> dict[str, tuple[bytes, int]]:
    """A binary KServe body per steady model, one per row: (body, header length)."""
    names = {"fraud_gb": ("input", "FP32", "probabilities"), "recommender": ("user", "INT64", "items"),
             "digits_cnn": ("image", "FP32", "logits")}
    out: dict[str, Any] = {}
    for model, (inp, dtype, output) in names.items():
        out[model] = []
        for row in rows[model][:32]:
            x = np.ascontiguousarray(row[None])
            header = json.dumps({"inputs": [{"name": inp, "shape": list(x.shape), "datatype": dtype,
                                             "parameters": {"binary_data_size": x.nbytes}}],
                                 "outputs": [{"name": output, "parameters": {"binary_data": True}}]}).encode()
            out[model].append((header + x.tobytes(), len(header)))
    return out


async def _steady(url: str, bodies: dict[str, list[tuple[bytes, int]]], rates: dict[str, float],
                  window_s: float) -> list[tuple[str, float, float, bool]]:
    """Open loop: each model's requests at their scheduled times; (model, sent at, latency s, ok)."""
    import httpx

    records: list[tuple[str, float, float, bool]] = []
    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=256)) as client:
        async def one(model: str, body: tuple[bytes, int], at: float) -> None:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            start = time.perf_counter()
            try:
                r = await client.post(f"/v2/models/{model}/infer", content=body[0], headers={
                    "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(body[1])})
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            records.append((model, start - t0, time.perf_counter() - start, ok))

        await asyncio.gather(*(one(m, bodies[m][k % len(bodies[m])], k / rate)
                               for m, rate in rates.items() for k in range(int(window_s * rate))))
    return records


def steady_client_main(argv: list[str]) -> None:
    """`--steady-client URL BODIES.npz RATES WINDOW`: runs the steady load, prints its records as JSON."""
    url, bodies_path, rates_text, window = argv
    data = np.load(bodies_path, allow_pickle=True)["bodies"].item()
    rates = dict(zip(STEADY, (float(r) for r in rates_text.split(",")), strict=True))
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(asyncio.run(_steady(url, data, rates, float(window)))), flush=True)


def _queue_us(target: Target) -> dict[str, tuple[int, int]]:
    import httpx

    out = {}
    for model in (*STEADY, "ocr", *HEAVY):
        s = httpx.get(f"http://{target.http}/v2/models/{model}/stats", timeout=30).json()["model_stats"][0]
        out[model] = (int(s["inference_stats"]["queue"]["ns"]), int(s["inference_stats"]["queue"]["count"]))
    return out


def run_case(name: str, repo: Path, root: Path, rows: dict[str, np.ndarray], args: argparse.Namespace,
             extra: list[str], page_header: int) -> dict[str, Any]:
    target = start_sluice(root, repo, ROOT, 1, *extra)
    try:
        bodies = root / "bodies.npz"
        np.savez(bodies, bodies=np.array(_bodies(rows), dtype=object))
        client = subprocess.Popen([sys.executable, __file__, "--steady-client", f"http://{target.http}", str(bodies),
                                   ",".join(str(r) for r in args.rates), str(args.window_s)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert client.stdout is not None and client.stdin is not None
        assert client.stdout.readline().strip() == "ready"
        pre_s = (args.window_s - args.burst_s) / 2
        snaps = [_queue_us(target)]
        client.stdin.write("go\n")
        client.stdin.flush()
        t0 = time.perf_counter()
        time.sleep(pre_s)
        snaps.append(_queue_us(target))
        burst_start = time.perf_counter() - t0
        page = root / "ocr.http.bin"
        env = {**os.environ, "SLUICE_WRK_BODY": str(page), "SLUICE_WRK_HEADER_LENGTH": str(page_header)}
        wrk = subprocess.run(["wrk", "-t", "2", "-c", str(args.burst_c), "-d", f"{args.burst_s}s", "--timeout", "60s",
                              "-s", str(LUA), f"http://{target.http}/v2/models/ocr/infer"],
                             env=env, capture_output=True, text=True, check=True).stdout
        burst_end = time.perf_counter() - t0
        snaps.append(_queue_us(target))
        records = json.loads(client.communicate(timeout=args.window_s + 120)[0].strip().splitlines()[-1])
        snaps.append(_queue_us(target))
        return summarise_case(name, records, snaps, (burst_start, burst_end), wrk)
    finally:
        target.stop()


def summarise_case(name: str, records: list, snaps: list, burst: tuple[float, float], wrk: str) -> dict[str, Any]:
    phases = {"before": (0.0, burst[0]), "during": burst, "after": (burst[1], float("inf"))}
    out: dict[str, Any] = {"case": name, "burst_s": [round(b, 2) for b in burst], "models": {}}
    for model in STEADY:
        per: dict[str, Any] = {}
        for i, (phase, (lo, hi)) in enumerate(phases.items()):
            lat = np.sort([r[2] for r in records if r[0] == model and lo <= r[1] < hi and r[3]]) * 1000
            failed = sum(1 for r in records if r[0] == model and lo <= r[1] < hi and not r[3])
            (q0, c0), (q1, c1) = snaps[i][model], snaps[i + 1][model]
            per[phase] = {"requests": len(lat), "failed": failed,
                          "p50_ms": round(float(lat[len(lat) // 2]), 2) if len(lat) else None,
                          "p99_ms": round(float(lat[min(len(lat) - 1, int(0.99 * len(lat)))]), 2) if len(lat) else None,
                          "queue_us_mean": round((q1 - q0) / (c1 - c0) / 1000, 1) if c1 > c0 else None}
        out["models"][model] = per
    line = next(x for x in wrk.splitlines() if x.startswith("WRK_JSON "))
    w = json.loads(line.removeprefix("WRK_JSON "))
    out["ocr_burst"] = {"requests": w["requests"], "errors": sum(w["errors"].values()),
                        "throughput_rps": round(w["requests"] / (w["duration_us"] / 1e6), 2),
                        "p50_ms": w["p50_us"] / 1000, "p99_ms": w["p99_us"] / 1000}
    (q0, c0), (q1, c1) = snaps[1]["ocr_det"], snaps[2]["ocr_det"]
    out["ocr_burst"]["det_queue_us_mean"] = round((q1 - q0) / (c1 - c0) / 1000, 1) if c1 > c0 else None
    print(json.dumps(out), flush=True)
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    """p99 per steady model and phase, without and with the limiter; the OCR burst's req/s in the titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(STEADY), figsize=(5 * len(STEADY), 4.2), squeeze=False)
    phases = ("before", "during", "after")
    for ax, model in zip(axes[0], STEADY, strict=True):
        for k, case in enumerate(report["cases"]):
            values = [case["models"][model][p]["p99_ms"] or 0 for p in phases]
            bars = ax.bar(np.arange(3) + 0.38 * k, values, 0.38, label=f"{case['case']} "
                          f"(ocr {case['ocr_burst']['throughput_rps']} req/s)")
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_xticks(np.arange(3) + 0.19, [f"{p} the burst" for p in phases])
        ax.set_title(f"{model}: p99 latency (ms)")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.suptitle("Mixed box: steady models while the OCR pipeline bursts")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--window-s", type=float, default=30.0)
    p.add_argument("--burst-s", type=int, default=14)
    p.add_argument("--burst-c", type=int, default=8)
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[40.0, 40.0, 20.0],
                   help="requests per second on fraud_gb, recommender, digits_cnn")
    p.add_argument("--out", type=Path, default=ROOT / "loadtests" / "reports")
    args = p.parse_args()
    if not 0 < args.burst_s < args.window_s or len(args.rates) != 3 or min(args.rates) <= 0:
        raise SystemExit("need 0 < --burst-s < --window-s and three positive --rates")
    return args


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--steady-client":
        steady_client_main(sys.argv[2:])
        return
    args = parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: run scripts/ensure_apt.sh (make apt)")
    root = Path(tempfile.mkdtemp(prefix="sluice-mixed-"))
    try:
        repo, rows = build_repo(root)
        page = ocr_page()
        header = json.dumps({"inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES",
                                         "parameters": {"binary_data_size": len(page) + 4}}]}).encode()
        (root / "ocr.http.bin").write_bytes(header + len(page).to_bytes(4, "little") + page)
        load0 = load_average()
        cases = [run_case("no limiter", repo, root, rows, args, [], len(header)),
                 run_case("rate limiter", limited_copy(repo, root), root, rows, args,
                          ["--rate-limit", "execution_count", "--rate-limit-resource", "heavy:1"], len(header))]
        report = {"benchmark": "mixed box: steady fraud_gb, recommender and digits_cnn while ocr bursts, "
                               "without and with the rate limiter",
                  "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                              "load_average_before": load0, "load_average_after": load_average()},
                  "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  "placement": placement(repo), "models": [*STEADY, *OCR_MODELS], "cases": cases}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "mixed_box.json").write_text(json.dumps(report, indent=2) + "\n")
        plot(report, args.out / "mixed_box.png")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
