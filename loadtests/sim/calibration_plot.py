"""The calibration report's PNG: per profile, cold and warm TTFT against prompt length and the
decode step time against batch size, real vLLM against the sim on the same workload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

VALIDATION = ("decode_client", "mixed_ttft", "mixed_gap")


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = report["profiles"]
    fig, axes = plt.subplots(len(sections), 4, figsize=(18, 4.2 * len(sections)), squeeze=False)
    for row, (name, section) in zip(axes, sections.items(), strict=True):
        points = section["comparison"]["points"]
        panels = (("cold", "cold TTFT (client)", "prompt tokens"),
                  ("warm", "warm TTFT (prefix cached, client)", "prompt tokens"),
                  ("decode", "decode step time (engine ITL; dotted: client)", "batch (sequences)"))
        for ax, (kind, title, xlabel) in zip(row, panels, strict=False):
            for k, style, label in ((kind, "-", ""), ("decode_client", ":", " (client)")):
                if k != kind and kind != "decode":
                    continue
                pts = sorted((p for p in points if p["kind"] == k), key=lambda p: p["x"])
                xs = [p["x"] for p in pts]
                ax.plot(xs, [p["real_s"] * 1e3 for p in pts], "o" + style, label="real vLLM" + label,
                        color="tab:blue")
                ax.plot(xs, [p["sim_s"] * 1e3 for p in pts], "s" + style, label="sim" + label, color="tab:orange")
            ax.set_title(f"{name}: {title}", fontsize=9)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("ms")
            if kind == "decode":
                ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        ax = row[3]
        pts = [p for p in points if p["kind"] in ("cold", "warm", "decode", "decode_client", "mixed_ttft",
                                                  "mixed_gap")]
        labels = [f"{p['kind']}:{p['x']}" for p in pts]
        ax.barh(range(len(pts)), [100 * p["rel_error"] for p in pts],
                color=["tab:gray" if p["kind"] in VALIDATION else "tab:green" for p in pts])
        ax.set_yticks(range(len(pts)), labels, fontsize=6)
        ax.axvline(0, color="black", lw=0.5)
        ax.set_xlabel("sim − real, % of real (grey: not fitted)")
        ax.set_title(f"{name}: error per point", fontsize=9)
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
