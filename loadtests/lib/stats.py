"""Percentiles as the live benchmarks report them (pure, no I/O).

`percentile(values, q)` is the nearest-rank value at `round(q·(n-1))` of the sorted values, so
p50 of an even count is one of the two middle values and p99 of fewer than 100 values is the
maximum or just below it; None when there are no values. The virtual-time experiments
(`routing/vtime/stats.py`) and `routing/bench_vllm.py` keep their own rank, `int(q·n)`: their
committed reports were computed with it.
"""

from __future__ import annotations

from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]
