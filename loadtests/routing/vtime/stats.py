"""The figures of one virtual-time run, as the routing reports give them.

- **hit rate**: prompt tokens the engines served from cache over all prompt tokens
  (vLLM's ``prompt_tokens_cached / prompt_tokens``), next to the upper bound of one
  engine with an infinite cache seeing every request (`records.Oracle`);
- **TTFT** p50/p90/p99, arrival at the gateway to the first token there;
- **goodput**: requests whose TTFT met the SLO, per second of the arrival window
  (first to last arrival); the SLO is seconds, or a function of the prompt's length;
- **imbalance**: max over mean across workers of engine busy time (the sum of
  step durations: prefill and decode work in seconds), and of prefill tokens
  computed and decode tokens separately;
- **decision time**: wall time of the ranking call, p50 and p99;
- **TTFT prediction error**: |predicted − actual| of the router's cost model, the
  median and p90 relative to the actual, and the mean in seconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from loadtests.routing.vtime.records import RunResult


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def imbalance(values: Sequence[float]) -> float:
    total = sum(values)
    return max(values) * len(values) / total if total > 0 else 1.0


def summarize(result: RunResult, slo_s: float | Callable[[int], float]) -> dict[str, Any]:
    done = [r for r in result.requests if r.ttft_s is not None]
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    slo = slo_s if callable(slo_s) else (lambda _n: float(slo_s))
    met = sum(1 for r in done if r.ttft_s is not None and r.ttft_s <= slo(r.prompt_tokens))
    prompt = sum(r.prompt_tokens for r in done)
    hit = sum(r.cached_tokens for r in done) / prompt if prompt else 0.0
    arrivals = [r.arrival_s for r in result.requests]
    window = max(arrivals) - min(arrivals) if len(arrivals) > 1 else 1.0
    errors = [(abs(r.predicted_ttft_s - r.ttft_s), r.ttft_s) for r in done
              if r.predicted_ttft_s is not None and r.ttft_s is not None and r.ttft_s > 0]
    ws = result.workers
    decisions = [r.decision_s for r in result.requests]
    return {
        "requests": len(result.requests),
        "finished": sum(1 for r in result.requests if r.finish_s is not None),
        "hit_rate": hit,
        "upper_bound_hit_rate": result.upper_bound_hit_rate,
        "hit_fraction_of_bound": hit / result.upper_bound_hit_rate if result.upper_bound_hit_rate else 1.0,
        "ttft_p50_s": pct(ttft, 0.5),
        "ttft_p90_s": pct(ttft, 0.9),
        "ttft_p99_s": pct(ttft, 0.99),
        "slo_attainment": met / len(result.requests) if result.requests else 0.0,
        "goodput_rps": met / window,
        "offered_rps": len(result.requests) / window,
        "imbalance_busy": imbalance([w.busy_s for w in ws]),
        "imbalance_prefill_tokens": imbalance([w.prefill_tokens for w in ws]),
        "imbalance_decode_tokens": imbalance([w.decode_tokens for w in ws]),
        "imbalance_tokens": imbalance([w.prefill_tokens + w.decode_tokens for w in ws]),
        "workers_used": sum(1 for w in ws if w.busy_s > 0),
        "decision_p50_us": pct(decisions, 0.5) * 1e6,
        "decision_p99_us": pct(decisions, 0.99) * 1e6,
        "ttft_error_rel_p50": pct([e / t for e, t in errors], 0.5),
        "ttft_error_rel_p90": pct([e / t for e, t in errors], 0.9),
        "ttft_error_mean_s": statistics.fmean(e for e, _ in errors) if errors else float("nan"),
        "virtual_s": result.virtual_s,
        "wall_s": result.wall_s,
    }


def group_spread(result: RunResult, group: str) -> dict[str, Any]:
    """How one prefix group's requests spread over workers (hot spots): workers serving it, and the
    largest worker's share."""
    counts: dict[str, int] = {}
    for r in result.requests:
        if r.group == group:
            counts[r.worker] = counts.get(r.worker, 0) + 1
    total = sum(counts.values())
    return {"group": group, "requests": total, "workers": len(counts),
            "top_worker_share": max(counts.values()) / total if total else 0.0}
