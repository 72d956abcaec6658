"""Routing experiments in virtual time: the real router's policies over a fleet of sim engines.

Every workload (`loadtests/routing/vtime/workloads.py`, plus the Mooncake FAST'25 trace replay,
`loadtests/routing/vtime/mooncake.py`) runs once per policy on a fresh `VirtualFleet` of `--workers`
sim engines (the calibrated `--profile`, default vLLM CPU with tiny-llama), each request
ranked by `router.Router` itself (hashing, index, KV events, load, learned cost). The
policies are Sluice's own (`prefix`, `least_load`, `session`, `round_robin`) and two
baselines that exist only here: a **model** of vllm-router's `cache_aware`
(`loadtests/routing/vtime/baselines.py`; a model, not vllm-router itself) and `longest_prefix`.

Reported per workload and policy: the engines' hit rate as a fraction of the upper bound
(one worker with an infinite cache seeing every request), TTFT p50/p99, goodput (requests
per second whose TTFT met the SLO: `--slo-factor` times the prompt's TTFT alone on an idle,
cold worker, plus `--slo-slack-s`), load imbalance (max over mean of the workers' busy
seconds: their prefill and decode steps), the routing decision's own wall time, and the
router's predicted-against-actual TTFT error. JSON and a PNG in loadtests/reports/.

    flock /tmp/sluice-bench.lock .venv/bin/python loadtests/routing/bench_vtime.py         # ~10-20 min
    .venv/bin/python loadtests/routing/bench_vtime.py --requests 400 --trace-limit 400 --out /tmp/x  # quick
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engines.sim import load_profile
from loadtests.routing.vtime import mooncake, workloads
from loadtests.routing.vtime.baselines import CacheAwareModel, longest_prefix
from loadtests.routing.vtime.fleet import Chooser, FleetConfig, VirtualFleet, policy_chooser
from loadtests.routing.vtime.sessions import Session
from loadtests.routing.vtime.stats import group_spread, summarize

REPORTS = ROOT / "loadtests" / "reports"
POLICIES = ("prefix", "least_load", "session", "round_robin", "cache_aware_model", "longest_prefix")
# Fleet-wide request rates per synthetic workload at 64 workers (scaled with --workers), set from
# the profile's cost so that a cache-blind policy's prefill work is a large part of the fleet's
# capacity (docqa: about all of it), while the shared prefixes leave room to a cache-aware one.
RATES = {"chat": 600.0, "docqa": 120.0, "agentic": 600.0, "skewed": 600.0, "nosharing": 1000.0}
# The trace at its own rate, and at 4 times it (arrival times / 4).
TRACES = {"trace": 1.0, "trace_x4": 0.25}


def chooser(policy: str) -> Chooser:
    if policy == "cache_aware_model":
        return CacheAwareModel()
    if policy == "longest_prefix":
        return longest_prefix
    return policy_chooser(policy)


def idle_ttft(profile: str, max_batched: int) -> Callable[[int], float]:
    """The TTFT of an n-token prompt alone on an idle worker with nothing cached (chunked prefill)."""
    c = load_profile(profile).cost

    def ttft(n: int) -> float:
        steps = max(1, math.ceil(n / max_batched))
        pairs = n * (n + 1) / 2
        return c.request_latency_s + steps * c.base_s + c.prefill_token_s * n + c.prefill_attn_s * pairs
    return ttft


def build(name: str, args: argparse.Namespace) -> list[Session]:
    if name in TRACES:
        rows = mooncake.load()
        return mooncake.sessions(rows, time_scale=args.trace_time_scale * TRACES[name],
                                 max_model_len=args.max_model_len, limit=args.trace_limit)
    rate = RATES[name] * args.workers / 64 * args.rate_scale
    return workloads.WORKLOADS[name](workloads.Shape(rate=rate, requests=args.requests, seed=args.seed))


def run_one(name: str, policy: str, args: argparse.Namespace, slo: Callable[[int], float]) -> dict[str, Any]:
    cfg = FleetConfig(workers=args.workers, profile=args.profile, max_model_len=args.max_model_len,
                      num_gpu_blocks=args.num_gpu_blocks)
    fleet = VirtualFleet(cfg)
    result = fleet.run(build(name, args), chooser(policy))
    out = summarize(result, slo)
    out["policy"] = policy
    groups: dict[str, int] = {}
    for r in result.requests:
        groups[r.group] = groups.get(r.group, 0) + 1
    if groups:
        hot = max(groups, key=lambda g: groups[g])
        out["hottest_group"] = group_spread(result, hot)
    return out


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    slo_base = idle_ttft(args.profile, 2048)

    def slo(n: int) -> float:
        return args.slo_factor * slo_base(n) + args.slo_slack_s

    report: dict[str, Any] = {"workers": args.workers, "profile": args.profile, "max_model_len": args.max_model_len,
                              "num_gpu_blocks": args.num_gpu_blocks, "slo": {"factor": args.slo_factor,
                                                                            "slack_s": args.slo_slack_s},
                              "trace_time_scale": args.trace_time_scale, "rate_scale": args.rate_scale,
                              "rates_rps": {k: v * args.workers / 64 * args.rate_scale for k, v in RATES.items()},
                              "workloads": {}}
    kept: dict[str, list[dict[str, Any]]] = {}
    if args.update:  # rerun only these policies; the other rows stay as the last full run measured them
        old = json.loads(args.out.with_suffix(".json").read_text())
        if any(old[k] != v for k, v in report.items() if k != "workloads"):
            raise SystemExit("--update: the saved report was run with other settings; run it whole")
        kept = old["workloads"]
        report["workloads"] = dict(kept)
    for name in args.workloads:
        rows = [r for r in kept.get(name, []) if r["policy"] not in args.policies]
        for policy in args.policies:
            row = run_one(name, policy, args, slo)
            rows.append(row)
            print(f"{name:10s} {policy:18s} hit/bound {row['hit_fraction_of_bound']:.3f}  "
                  f"p99 {row['ttft_p99_s']:.2f}s  goodput {row['goodput_rps']:.2f}/s  "
                  f"imb {row['imbalance_busy']:.2f}  err50 {row['ttft_error_rel_p50']:.3f}  "
                  f"({row['wall_s']:.0f}s)", flush=True)
        order = {p: i for i, p in enumerate(POLICIES)}
        report["workloads"][name] = sorted(rows, key=lambda r: order.get(r["policy"], len(order)))
        report["verdict"] = verdict(report)
        save(report, args.out)  # after each workload: a run cut short keeps what it measured
    return report


def save(report: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out.with_suffix(".png"))


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, checked on what was measured."""
    out: dict[str, Any] = {}
    trace = {r["policy"]: r for r in report["workloads"].get("trace", [])}
    if "prefix" in trace:
        p = trace["prefix"]
        out["trace_hit_fraction"] = p["hit_fraction_of_bound"]
        out["trace_imbalance"] = p["imbalance_busy"]
        out["trace_targets_met"] = p["hit_fraction_of_bound"] >= 0.95 and p["imbalance_busy"] <= 1.25
    wins = {}
    for name, rows in report["workloads"].items():  # the targets' trace is at its own rate
        by = {r["policy"]: r for r in rows}
        if name == "nosharing" or "prefix" not in by:
            continue
        rivals = [by[k]["goodput_rps"] for k in ("least_load", "cache_aware_model") if k in by]
        wins[name] = all(by["prefix"]["goodput_rps"] >= g for g in rivals)
    out["prefix_wins"] = wins
    out["prefix_default_justified"] = bool(wins) and all(wins.values())
    return out


def _value(rows: list[dict[str, Any]], policy: str, key: str) -> float:
    row = next(r for r in rows if r["policy"] == policy)
    if key != "goodput_rps":
        return float(row[key])
    base = next((r[key] for r in rows if r["policy"] == "least_load"), None)
    return float(row[key] / base) if base else float("nan")


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["workloads"])
    policies = [r["policy"] for r in report["workloads"][names[0]]]
    metrics = (("hit_fraction_of_bound", "hit rate / upper bound"), ("ttft_p99_s", "TTFT p99 (s, log)"),
               ("goodput_rps", "goodput / least_load's"), ("imbalance_busy", "load imbalance (max/mean)"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4.5))
    width = 0.8 / len(policies)
    for ax, (key, title) in zip(axes, metrics, strict=True):
        for i, policy in enumerate(policies):
            ys = [_value(report["workloads"][n], policy, key) for n in names]
            ax.bar([x + i * width for x in range(len(names))], ys, width, label=policy)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], names, rotation=30)
        ax.set_title(title)
        if key == "ttft_p99_s":
            ax.set_yscale("log")
        if key == "goodput_rps":
            ax.set_ylim(0.5, 1.1)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Routing in virtual time: {report['workers']} sim workers ({report['profile']}); "
                 "cache_aware_model is a model of vllm-router's cache_aware")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--profile", default="vllm-cpu-tiny-llama")
    ap.add_argument("--workloads", nargs="+", default=[*TRACES, *RATES])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--requests", type=int, default=4000, help="per synthetic workload (about)")
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--trace-limit", type=int, default=None)
    ap.add_argument("--trace-time-scale", type=float, default=1.0, help="stretch the trace's arrivals")
    ap.add_argument("--max-model-len", type=int, default=32768, help="longer trace prompts are cut")
    ap.add_argument("--num-gpu-blocks", type=int, default=None, help="KV blocks per worker [profile's]")
    ap.add_argument("--slo-factor", type=float, default=3.0)
    ap.add_argument("--slo-slack-s", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=REPORTS / "routing_vtime")
    ap.add_argument("--update", action="store_true",
                    help="rerun only --policies and replace their rows in the saved report (same settings)")
    args = ap.parse_args()
    report = run_all(args)
    print(json.dumps(report["verdict"], indent=2))


if __name__ == "__main__":
    main()
