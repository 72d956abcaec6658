"""Draw a dashboard's panels from a Prometheus's answers to their queries, with matplotlib.

    python deploy/grafana/render.py --prometheus http://127.0.0.1:9090 \
        --dashboard deploy/grafana/llm-overview.json --out llm-overview.png

This is not Grafana: it runs each panel's PromQL through Prometheus's /api/v1/query_range (the
dashboard's variables set to all their values, as Grafana's "All" sends them) and plots the
answers where the panel sits, so that a dashboard can be looked at where no Grafana runs. Prints
{"panels": N, "empty": [titles that returned no data]} as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

import httpx

# `label_values(metric, label)` or `label_values(metric{matchers}, label)`; a metric name may hold
# colons (vLLM's `vllm:*`), and the matchers name the variables before this one.
LABEL_VALUES = re.compile(r"label_values\(([a-zA-Z_:][\w:]*)(\{[^{}]*\})?,\s*(\w+)\)")


def _substitute(text: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), text)


def _values(prom: str, definition: str, before: dict[str, str]) -> str:
    """The regex Grafana's "All" sends for a variable, the values of `before` in its matchers."""
    m = LABEL_VALUES.fullmatch(definition)
    if not m:
        return ".*"
    match = m.group(1) + _substitute(m.group(2) or "", before)
    found = httpx.get(f"{prom}/api/v1/label/{m.group(3)}/values", params={"match[]": match},
                      timeout=30).json()["data"]
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", v) for v in found if v]
    return "(" + "|".join(escaped) + ")" if escaped else ""


def _legend(fmt: str, labels: dict[str, str]) -> str:
    if not fmt or fmt == "__auto":
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def _series(prom: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    r = httpx.get(f"{prom}/api/v1/query_range", params={"query": expr, "start": start, "end": end, "step": step},
                  timeout=60).json()
    if r.get("status") != "success":
        raise SystemExit(f"query failed: {expr}: {r.get('error')}")
    return list(r["data"]["result"])


def render(prom: str, board: dict[str, Any], minutes: float, rate_interval: str, out: str) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variables: dict[str, str] = {}
    for v in board["templating"]["list"]:
        if v["type"] == "query":
            variables[v["name"]] = _values(prom, v["query"], variables)
    end = time.time()
    start, step = end - minutes * 60, max(1.0, minutes * 60 / 150)
    panels = [p for p in board["panels"] if p["type"] != "row"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(16, rows * 0.42))
    fig.suptitle(f"{board['title']}: its panels' queries against a live Prometheus, drawn with matplotlib "
                 "(a rendering, not a Grafana screenshot)", fontsize=11)
    empty = []
    # Room below each panel for its tick labels (0.65 in) and above it for its title (0.9 in), as
    # fractions of the figure's height, which grows with the rows.
    below, room = 0.65 / (rows * 0.42), 1.55 / (rows * 0.42)
    for panel in panels:
        g = panel["gridPos"]
        ax = fig.add_axes((g["x"] / 24 + 0.035, 1 - (g["y"] + g["h"]) / rows + below, g["w"] / 24 - 0.045,
                           max(0.005, g["h"] / rows - room)))
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        ax.set_title(f"{panel['title']}" + (f" [{unit}]" if unit and unit != "short" else ""), fontsize=8)
        ax.tick_params(labelsize=6)
        drawn = 0
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", rate_interval)
            expr = _substitute(expr, variables)
            for s in _series(prom, expr, start, end, step):
                points = [(float(t) - end, float(v)) for t, v in s["values"] if v not in ("NaN", "+Inf", "-Inf")]
                if not points:
                    continue
                drawn += 1
                label = _legend(target.get("legendFormat", ""), s["metric"])
                if panel["type"] == "stat":
                    ax.text(0.5, 0.45, f"{points[-1][1]:.3g}", ha="center", va="center", fontsize=20,
                            transform=ax.transAxes)
                    ax.set_xticks([])
                    ax.set_yticks([])
                    break
                ax.plot([p[0] for p in points], [p[1] for p in points], label=label[:40], linewidth=1)
        if not drawn:
            empty.append(panel["title"])
            ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes, color="grey")
        elif panel["type"] != "stat":
            ax.legend(fontsize=5, loc="upper left")
            ax.set_xlabel("seconds before now", fontsize=6)
    fig.savefig(out, dpi=110)
    return {"panels": len(panels), "empty": empty}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    p.add_argument("--dashboard", required=True, help="a dashboard JSON of deploy/grafana")
    p.add_argument("--minutes", type=float, default=15.0, help="time range, ending now [15]")
    p.add_argument("--rate-interval", default="1m", help="what $__rate_interval becomes [1m]")
    p.add_argument("--out", required=True, help="PNG to write")
    args = p.parse_args(argv)
    with open(args.dashboard) as f:
        board = json.load(f)
    print(json.dumps(render(args.prometheus.rstrip("/"), board, args.minutes, args.rate_interval, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
