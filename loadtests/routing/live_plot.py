"""The live routing report as one PNG: per fleet size, hit rate (with the upper bound), TTFT p50
and p99, goodput and imbalance, grouped by workload and rate, one bar per policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

METRICS = (("hit_rate_usage", "engine hit rate (tick: upper bound)"), ("ttft_p50_s", "TTFT p50 (s)"),
           ("ttft_p99_s", "TTFT p99 (s)"), ("goodput_rps", "goodput (req/s within SLO)"),
           ("imbalance_uncached_prefill", "imbalance (max/mean prefill)"))


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    sizes = sorted({r["workers"] for r in rows})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = plt.subplots(len(sizes), len(METRICS), figsize=(4.6 * len(METRICS), 3.6 * len(sizes)), squeeze=False)
    for si, n in enumerate(sizes):
        mine = [r for r in rows if r["workers"] == n]
        groups = list(dict.fromkeys((r["workload"], r["rate_level"]) for r in mine))
        width = 0.8 / max(1, len(policies))
        for mi, (key, label) in enumerate(METRICS):
            ax = axes[si][mi]
            for pi, pol in enumerate(policies):
                vals = []
                for g in groups:
                    hit = next((r for r in mine if (r["workload"], r["rate_level"]) == g and r["policy"] == pol), None)
                    vals.append((hit or {}).get(key) or 0.0)
                ax.bar([gi + (pi - (len(policies) - 1) / 2) * width for gi in range(len(groups))], vals, width,
                       label=pol)
            if key == "hit_rate_usage":
                for gi, g in enumerate(groups):
                    bound = next(r["upper_bound_hit_rate"] for r in mine if (r["workload"], r["rate_level"]) == g)
                    ax.plot([gi - 0.45, gi + 0.45], [bound, bound], color="k", lw=1.5)
            ax.set_xticks(range(len(groups)), [f"{w}\n{lvl}" for w, lvl in groups], fontsize=7)
            ax.set_title(f"{n} workers: {label}", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
            if key.startswith("ttft"):
                ax.set_yscale("log")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"live routing, sim fleet ({report['profile']}), SLO TTFT {report['slo_ttft_s']} s", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
