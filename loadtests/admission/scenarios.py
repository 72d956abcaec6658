"""The scenarios of bench_admission.py, their summaries, the verdict against issue 24, and the plot."""

from __future__ import annotations

import argparse
import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from loadtests.admission.traffic import Bench, Req, Target, closed, one, poisson
from loadtests.lib.stats import percentile


def queue_wait(text: str, tenant: str) -> dict[str, float]:
    """From the gateway's /metrics: how many of `tenant`'s requests waited in its admission queue, and long."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "sluice_tenant_queue_time_seconds":
            continue
        for s in family.samples:
            if s.labels.get("tenant") != tenant:
                continue
            if s.name.endswith("_count"):
                out["count"] = out.get("count", 0) + s.value
            elif s.name.endswith("_sum"):
                out["sum_s"] = out.get("sum_s", 0) + s.value
            elif s.name.endswith("_bucket") and s.labels.get("le") in ("0.0", "0.05"):
                key = "no_wait" if s.labels["le"] == "0.0" else "within_50ms"
                out[key] = out.get(key, 0) + s.value
    return out


def metric_value(text: str, name: str) -> float | None:
    """The first sample of `name` in a Prometheus text exposition (None: absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


WARMUP_S = 10.0  # `*_after_warmup`: requests sent this long after the run began


def _ms(v: float | None) -> float | None:
    return None if v is None else round(1000 * v, 1)


def summary(reqs: list[Req]) -> dict[str, Any]:
    ok = [r for r in reqs if r.status == 200 and not r.error and r.ttft_s is not None]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    later = [r.ttft_s for r in ok if r.ttft_s is not None and r.sent >= WARMUP_S]
    good = {id(r) for r in ok}
    failed = [r for r in reqs if id(r) not in good]
    why = sorted({f"{r.status} {(r.error or 'no content')[:120]}" for r in failed})[:4]
    return {"sent": len(reqs), "ok": len(ok), "refused": len(reqs) - len(ok), "refusals": why,
            "ttft_p50_ms": _ms(percentile(ttft, 0.5)), "ttft_p99_ms": _ms(percentile(ttft, 0.99)),
            "ttft_p99_after_warmup_ms": _ms(percentile(later, 0.99)), "tokens": sum(r.tokens for r in ok)}


def by_tenant(target: Target) -> dict[str, dict[str, Any]]:
    tenants = sorted({r.tenant for r in target.done})
    return {t: summary([r for r in target.done if r.tenant == t]) for t in tenants}


async def noisy(bench: Bench, args: argparse.Namespace, x: float) -> dict[str, Any]:
    def scenario(with_a: bool) -> Callable[[Target, float], Awaitable[None]]:
        async def run(target: Target, t0: float) -> None:
            rng = random.Random(args.seed)
            d = args.duration_s
            jobs = [poisson(args.steady * x / 4, d, 0.0, lambda t=t: one(target, t, t0, args), rng) for t in "bcd"]
            if with_a:  # 10x its share, over the middle third
                jobs.append(poisson(2.5 * x, d / 3, d / 3, lambda: one(target, "a", t0, args), rng))
            await asyncio.gather(*jobs)
        return run

    out = {}
    for name, flags, with_a, router in (("alone", (), False, False), ("fair", (), True, False),
                                        ("fcfs", ("--admission-order", "fcfs"), True, False),
                                        ("vllm_router", (), True, True)):
        target, _ = await bench.run(f"noisy-{name}", scenario(with_a), *flags, router=router)
        out[name] = by_tenant(target)
        steady = [r for r in target.done if r.tenant in "bcd"]
        out[name]["b-d"] = summary(steady)
        print(f"noisy {name:<12} B-D {out[name]['b-d']}  A {out[name].get('a')}", flush=True)
    return out


async def fairness(bench: Bench, args: argparse.Namespace, slots: int) -> dict[str, Any]:
    tenants = ("w1", "w2", "w3")
    weights = {"w1": 1.0, "w2": 2.0, "w3": 3.0}

    async def run(target: Target, t0: float) -> None:
        await asyncio.gather(*(closed(slots, args.duration_s, lambda t=t: one(target, t, t0, args)) for t in tenants))

    target, metrics = await bench.run("fairness", run)
    lo, hi = 5.0, args.duration_s  # all three backlogged from the start; the first seconds settle counters
    served = {t: sum(r.tokens for r in target.done if r.tenant == t and r.end_s is not None and lo <= r.end_s <= hi)
              for t in tenants}
    per_weight = [served[t] / weights[t] for t in tenants]
    jain = sum(per_weight) ** 2 / (len(per_weight) * sum(v * v for v in per_weight)) if any(per_weight) else None
    print(f"fairness served {served} jain {jain}", flush=True)
    return {"weights": weights, "tokens_served_in_window": served, "window_s": [lo, hi],
            "tokens_per_weight": dict(zip(tenants, per_weight, strict=True)), "jain": jain,
            "gateway_fairness_index": metric_value(metrics, "sluice_fairness_index"), "tenants": by_tenant(target)}


async def priority(bench: Bench, args: argparse.Namespace, x: float) -> dict[str, Any]:
    urgent = {"X-Sluice-Priority": "interactive"}

    def scenario(batch: str | None, classes: bool) -> Callable[[Target, float], Awaitable[None]]:
        async def run(target: Target, t0: float) -> None:
            rng = random.Random(args.seed)
            jobs = [poisson(0.3 * x, args.duration_s, 0.0,
                            lambda: one(target, "ui", t0, args, urgent if classes else None), rng)]
            if batch is not None:
                jobs.append(poisson(1.2 * x, args.duration_s, 0.0, lambda: one(target, batch, t0, args), rng))
            await asyncio.gather(*jobs)
        return run

    out = {}
    for name, batch, classes in (("interactive_alone", None, True), ("two_classes", "etl", True),
                                 ("one_class", "a", False)):
        target, metrics = await bench.run(f"priority-{name}", scenario(batch, classes))
        out[name] = by_tenant(target)
        out[name]["ui"]["gateway_queue"] = queue_wait(metrics, "ui")
        print(f"priority {name:<18} {out[name]}", flush=True)
    return out


async def deadlines(bench: Bench, args: argparse.Namespace, x: float) -> dict[str, Any]:
    d_s = args.deadline_ms / 1000

    def scenario(load: float, header: bool) -> Callable[[Target, float], Awaitable[None]]:
        h = {"X-Sluice-TTFT-Deadline-Ms": str(args.deadline_ms)} if header else None

        async def run(target: Target, t0: float) -> None:
            await poisson(load * x, args.duration_s, 0.0, lambda: one(target, "a", t0, args, h),
                          random.Random(args.seed))
        return run

    out: dict[str, Any] = {}
    for load in (1.0, 1.5, 2.0):
        row = {}
        for mode, header in (("admit_all", False), ("deadline", True)):
            target, _ = await bench.run(f"deadline-{load}-{mode}", scenario(load, header), "--max-queued", "4096")
            ok = [r for r in target.done if r.status == 200 and not r.error and r.ttft_s is not None]
            met = [r for r in ok if (r.ttft_s or 0) <= d_s]
            late = [(r.ttft_s or 0) - d_s for r in ok if (r.ttft_s or 0) > d_s]
            errors = [abs((r.ttft_s or 0) - r.predicted_s) for r in ok if r.predicted_s is not None]
            row[mode] = {**summary(target.done), "met": len(met), "goodput_per_s": round(len(met) / args.duration_s, 2),
                         "missed": len(late), "max_late_ms": _ms(max(late, default=0.0)),
                         "predictor_abs_error_p90_ms": _ms(percentile(errors, 0.9))}
        out[str(load)] = row
        print(f"deadlines {load}x {row}", flush=True)
    return out


async def single_tenant(bench: Bench, args: argparse.Namespace, x: float) -> dict[str, Any]:
    async def run(target: Target, t0: float) -> None:
        await poisson(1.2 * x, args.duration_s, 0.0, lambda: one(target, "a", t0, args), random.Random(args.seed))

    out = {}
    for name, flags in (("default", ()), ("fcfs", ("--admission-order", "fcfs"))):
        target, _ = await bench.run(f"single-{name}", run, *flags)
        out[name] = summary(target.done)
        print(f"single tenant {name:<8} {out[name]}", flush=True)
    return out


async def run_all(bench: Bench, args: argparse.Namespace,
                  capacity: Callable[[Bench, argparse.Namespace], Awaitable[dict[str, float]]]) -> dict[str, Any]:
    cap = await capacity(bench, args)
    x = cap["requests_per_s"]
    print(f"capacity {cap}", flush=True)
    report: dict[str, Any] = {"capacity": cap}
    wanted = set(args.only or ("noisy", "fairness", "priority", "deadlines", "single_tenant"))
    if "noisy" in wanted:
        report["noisy_neighbour"] = await noisy(bench, args, x)
    if "fairness" in wanted:
        report["fairness"] = await fairness(bench, args, int(cap["slots"]))
    if "priority" in wanted:
        report["priority"] = await priority(bench, args, x)
    if "deadlines" in wanted:
        report["deadlines"] = await deadlines(bench, args, x)
    if "single_tenant" in wanted:
        report["single_tenant"] = await single_tenant(bench, args, x)
    report["verdict"] = verdict(report)
    return report


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 24's Done-when conditions, as measured in this run."""
    out: dict[str, Any] = {}
    hold_ms = 1000 * report["capacity"]["hold_s"]
    if "noisy_neighbour" in report:
        n = report["noisy_neighbour"]
        solo, bound = n["alone"]["b-d"]["ttft_p99_ms"], None
        if solo is not None:
            bound = round(1.5 * solo + hold_ms, 1)
        out["noisy_b_d_p99_ms"] = {k: n[k]["b-d"]["ttft_p99_ms"] for k in ("alone", "fair", "fcfs", "vllm_router")}
        out["noisy_b_d_refused"] = {k: n[k]["b-d"]["refused"] for k in ("alone", "fair", "fcfs", "vllm_router")}
        # A refused request never gets a first token: counted as infinitely late, the p99 of B-D under a
        # policy that refuses more than 1% of them is unbounded.
        out["noisy_b_d_p99_refusals_as_infinite_ms"] = {
            k: (n[k]["b-d"]["ttft_p99_ms"] if n[k]["b-d"]["refused"] <= 0.01 * n[k]["b-d"]["sent"] else "inf")
            for k in ("alone", "fair", "fcfs", "vllm_router")}
        out["noisy_bound_ms"] = bound
        fair = n["fair"]["b-d"]["ttft_p99_ms"]
        out["noisy_fair_within_bound"] = bool(bound and fair is not None and fair <= bound
                                              and n["fair"]["b-d"]["refused"] == 0)
    if "fairness" in report:
        out["jain"] = report["fairness"]["jain"]
        out["jain_at_least_0.95"] = bool(out["jain"] and out["jain"] >= 0.95)
    if "priority" in report:
        p = report["priority"]
        alone, loaded = p["interactive_alone"]["ui"]["ttft_p99_ms"], p["two_classes"]["ui"]["ttft_p99_ms"]
        out["interactive_p99_ms"] = {"alone": alone, "two_classes": loaded, "one_class": p["one_class"]["ui"][
            "ttft_p99_ms"]}
        out["interactive_within_2x"] = bool(alone and loaded is not None and loaded <= 2 * alone)
    if "deadlines" in report:
        d = report["deadlines"]["2.0"]
        base = d["admit_all"]["goodput_per_s"]
        out["goodput_2x"] = {"admit_all": base, "deadline": d["deadline"]["goodput_per_s"],
                             "ratio": round(d["deadline"]["goodput_per_s"] / base, 2) if base else None}
        out["goodput_ratio_at_least_1.3"] = bool((base == 0 and d["deadline"]["goodput_per_s"] > 0)
                                                 or (base and d["deadline"]["goodput_per_s"] >= 1.3 * base))
        late = [report["deadlines"][k]["deadline"] for k in report["deadlines"]]
        out["late_within_predictor_p90"] = all((r["max_late_ms"] or 0) <= (r["predictor_abs_error_p90_ms"] or 0)
                                               for r in late)
    return out


def plot(report: dict[str, Any], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    if "noisy_neighbour" in report:
        n = report["noisy_neighbour"]
        names = ["alone", "fair", "fcfs", "vllm_router"]
        axes[0].bar(names, [n[k]["b-d"]["ttft_p99_ms"] or 0 for k in names],
                    color=["#999999", "#1f77b4", "#ff7f0e", "#7f7f7f"])
        for i, k in enumerate(names):
            bd = n[k]["b-d"]
            if bd["refused"]:
                axes[0].annotate(f"{bd['refused']}/{bd['sent']} refused", (i, bd["ttft_p99_ms"] or 1), ha="center",
                                 va="bottom", fontsize=8)
        axes[0].set_yscale("log")
        axes[0].set_title("noisy neighbour: B-D TTFT p99 (ms)", fontsize=10)
    if "fairness" in report:
        f = report["fairness"]
        axes[1].bar(list(f["tokens_per_weight"]), list(f["tokens_per_weight"].values()), color="#1f77b4")
        axes[1].set_title(f"tokens served per weight (Jain {f['jain']:.3f})" if f["jain"] else "tokens per weight",
                          fontsize=10)
    if "priority" in report:
        p = report["priority"]
        names = ["interactive_alone", "two_classes", "one_class"]
        axes[2].bar(names, [p[k]["ui"]["ttft_p99_ms"] or 0 for k in names], color="#2ca02c")
        axes[2].set_title("interactive TTFT p99 (ms) at 1.5x capacity", fontsize=10)
        axes[2].tick_params(axis="x", labelsize=8)
    if "deadlines" in report:
        d = report["deadlines"]
        loads = list(d)
        for mode, colour in (("admit_all", "#ff7f0e"), ("deadline", "#1f77b4")):
            axes[3].plot([float(x) for x in loads], [d[x][mode]["goodput_per_s"] for x in loads], "o-",
                         color=colour, label=mode)
        axes[3].set_xlabel("offered load (x capacity)")
        axes[3].set_title("goodput (first token within the deadline, req/s)", fontsize=10)
        axes[3].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
