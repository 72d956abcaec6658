"""What the live routing benchmark computes from a run (pure, no I/O).

- `upper_bound(prompts, block_size)`: the share of prompt tokens one worker with an infinite
  prefix cache would serve from cache, seeing every request in order (whole blocks only, the
  last prompt token always recomputed, as vLLM does).
- `worker_counters(text)`: per engine, the vLLM counters a run is measured by, from /metrics.
- `summarize(...)`: hit rate (engine-reported), TTFT p50/p99, goodput within a TTFT SLO, and load
  imbalance (max over mean per-worker work) for one policy's run.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loadtests.lib.stats import percentile

_COUNTERS = ("vllm:prompt_tokens_total", "vllm:prompt_tokens_cached_total", "vllm:prefix_cache_queries_total",
             "vllm:prefix_cache_hits_total", "vllm:generation_tokens_total")


def upper_bound(prompts: Sequence[Sequence[int]], block_size: int) -> float:
    seen: set[tuple[int, ...]] = set()  # chain keys: (parent key hash, block tokens) hashed
    cached = total = 0
    for ids in prompts:
        n_full = len(ids) // block_size
        cacheable = (len(ids) - 1) // block_size if ids else 0
        parent = 0
        hit = 0
        keys = []
        for b in range(n_full):
            key = hash((parent, tuple(ids[b * block_size:(b + 1) * block_size])))
            keys.append(key)
            parent = key
        for b, key in enumerate(keys[:cacheable]):
            if (key,) not in seen:
                break
            hit = b + 1
        seen.update((k,) for k in keys)
        cached += hit * block_size
        total += len(ids)
    return cached / total if total else 0.0


def worker_counters(text: str) -> dict[str, float]:
    out = dict.fromkeys(_COUNTERS, 0.0)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    ttft_s: float | None
    prompt_tokens: int
    cached_tokens: int
    error: str | None = None


def summarize(outcomes: list[Outcome], window_s: float, slo_ttft_s: float,
              before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, Any]:
    ok = [o for o in outcomes if o.ok]
    ttft = [o.ttft_s for o in ok if o.ttft_s is not None]
    prompt = sum(o.prompt_tokens for o in ok)
    work = {}
    hits = queries = 0.0
    for w in after:
        d = {k: after[w][k] - before.get(w, {}).get(k, 0.0) for k in after[w]}
        work[w] = {"uncached_prompt_tokens": d["vllm:prompt_tokens_total"] - d["vllm:prompt_tokens_cached_total"],
                   "prompt_tokens": d["vllm:prompt_tokens_total"],
                   "generation_tokens": d["vllm:generation_tokens_total"]}
        hits += d["vllm:prefix_cache_hits_total"]
        queries += d["vllm:prefix_cache_queries_total"]

    def imbalance(key: str) -> float | None:
        vals = [v[key] for v in work.values()]
        mean = statistics.fmean(vals) if vals else 0.0
        return max(vals) / mean if mean > 0 else None

    return {"requests": len(outcomes), "ok": len(ok), "failed": len(outcomes) - len(ok),
            "first_error": next((o.error for o in outcomes if not o.ok), None),
            "hit_rate_usage": sum(o.cached_tokens for o in ok) / prompt if prompt else None,
            "hit_rate_metrics": hits / queries if queries else None,
            "ttft_p50_s": percentile(ttft, 0.5), "ttft_p99_s": percentile(ttft, 0.99),
            "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
            "goodput_rps": sum(1 for t in ttft if t <= slo_ttft_s) / window_s,
            "throughput_rps": len(ok) / window_s,
            "imbalance_uncached_prefill": imbalance("uncached_prompt_tokens"),
            "imbalance_prompt_tokens": imbalance("prompt_tokens"), "per_worker": work}
