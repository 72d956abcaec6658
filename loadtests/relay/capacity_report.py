"""What `bench_capacity.py` computes from one target's streams, and its PNG (pure, no I/O but the PNG)."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from loadtests.lib.stats import percentile
from loadtests.lib.stream_client import StreamResult


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def plateau(samples: list[dict[str, float]], n: int) -> list[dict[str, float]]:
    """The samples taken while (nearly) every stream was in flight."""
    top = max((s["inflight"] for s in samples), default=0)
    return [s for s in samples if s["inflight"] >= 0.99 * min(n, top) > 0]


def summarize(results: list[StreamResult], failures: list[str], n: int, tokens: int,
              samples: list[dict[str, float]], idle_rss: int, cpu: dict[str, float]) -> dict[str, Any]:
    whole = [r for r in results if r.status == 200 and r.done and not r.error and r.completion_tokens == tokens]
    statuses = Counter(r.status for r in results if r.status != 200)
    gaps = [g for r in results for g in r.itl_s]
    worst = [max(r.itl_s) for r in results if len(r.content_times_s) > 1]
    ttft = [r.ttft_s for r in results if r.ttft_s is not None]
    produced = sum(r.completion_tokens for r in results)
    top = plateau(samples, n)
    row: dict[str, Any] = {
        "finished_whole": len(whole), "status_503": statuses.pop(503, 0), "other_statuses": dict(statuses),
        "error_events": sum(1 for r in results if r.status == 200 and r.error),
        "first_error": next((r.error for r in results if r.error), None),
        "client_failures": len(failures), "first_client_failure": failures[0] if failures else None,
        "ttft_p50_ms": _ms(percentile(ttft, 0.5)), "ttft_p99_ms": _ms(percentile(ttft, 0.99)),
        "gap_p50_ms": _ms(percentile(gaps, 0.5)), "gap_p99_ms": _ms(percentile(gaps, 0.99)),
        "worst_gap_p99_ms": _ms(percentile(worst, 0.99)), "tokens": produced,
        "peak_inflight": max((s["inflight"] for s in samples), default=0),
        "cpu_ms_per_1k_tokens": {k: round(v * 1e6 / max(produced, 1), 1) for k, v in cpu.items()},
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "samples": samples,
    }
    if idle_rss and top:
        rss = statistics.median(s["rss_mib"] for s in top) * 2**20
        open_streams = statistics.fmean(s["inflight"] for s in top)
        row.update({"rss_idle_mib": round(idle_rss / 2**20, 1), "rss_plateau_mib": round(rss / 2**20, 1),
                    "plateau_samples": len(top), "streams_open_at_plateau": round(open_streams),
                    "rss_per_stream_kib": round((rss - idle_rss) / open_streams / 1024, 1)})
    else:
        row["rss_per_stream_kib"] = None
    return row


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if "skipped" not in r]
    names = [r["target"] for r in rows]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    panels = [("finished whole", "finished_whole"), ("TTFT p99 (ms)", "ttft_p99_ms"),
              ("worst gap of a stream, p99 (ms)", "worst_gap_p99_ms"),
              ("gateway RSS per open stream (KiB)", "rss_per_stream_kib"),
              ("gateway CPU ms per 1k tokens", "gateway_cpu_ms_per_1k_tokens")]
    for ax, (title, key) in zip(axes.flat, panels, strict=False):
        values = [(r["cpu_ms_per_1k_tokens"].get("gateway") if key.startswith("gateway_cpu") else r.get(key)) or 0
                  for r in rows]
        ax.bar(names, values, color=[f"C{i}" for i in range(len(rows))])
        for i, v in enumerate(values):
            ax.annotate(f"{v:g}", (i, v), ha="center", va="bottom", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
    ax = axes.flat[5]
    for i, r in enumerate(rows):
        if r["target"] != "direct":
            ax.plot([s["t_s"] for s in r["samples"]], [s["rss_mib"] for s in r["samples"]], color=f"C{i}",
                    label=r["target"])
    ax.set_title("gateway RSS (MiB) over the run (s)", fontsize=10)
    ax.legend(fontsize=8)
    fig.suptitle(f"{report['streams']} concurrent chat streams, {report['workers']} sim workers, a token every "
                 f"{report['step_s']} s, {report['tokens']} tokens each", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
