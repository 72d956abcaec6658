"""The live routing bench's cells replayed in virtual time: placement without the machine.

`loadtests/routing/bench_live.py` runs its policies on real sockets, where the gateway, the sim fleet
and the client share the CPUs: a cell's goodput then says as much about how busy the machine was as
about where each request went. This replays the same cells in virtual time (`loadtests/routing/vtime/`):
the same workloads (`live_workloads.py`, seed 1, 20 s of open-loop arrivals at the live rates), the
same engine (the `vllm-cpu-smollm2-135m` profile, 32-token blocks, 46,592 KV tokens per worker), the
real `router.Router`, and the same goodput (requests with a TTFT within 2 s, per second of arrivals),
with no gateway CPU at all. `cache_aware_model` is the vtime model of vllm-router's `cache_aware`
(`vtime/baselines.py`), not vllm-router itself.

Prompts are token ids of one-token words (a word is its index in a synthetic vocabulary); chat
messages are wrapped in a few fixed role tokens, as a chat template would.

    .venv/bin/python loadtests/routing/bench_vtime_live.py                       # 64 workers, ~5 min
    .venv/bin/python loadtests/routing/bench_vtime_live.py --cells nosharing:high,skewed:high

JSON in loadtests/reports/routing_vtime_live_cells.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadtests.routing.live_workloads import WORKLOADS, Request, Vocab
from loadtests.routing.vtime.baselines import CacheAwareModel
from loadtests.routing.vtime.fleet import Chooser, FleetConfig, VirtualFleet, policy_chooser
from loadtests.routing.vtime.sessions import Session, Turn, turns_of

REPORT = ROOT / "loadtests" / "reports" / "routing_vtime_live_cells.json"
# bench_live.RATES: requests/s at 8 workers (low, high), scaled with the fleet.
RATES = {"chat": (3.0, 8.0), "skewed": (3.0, 8.0), "agentic": (3.0, 8.0), "docqa": (1.5, 4.0),
         "nosharing": (2.0, 5.0)}
POLICIES = ("prefix", "least_load", "round_robin", "cache_aware_model")
_WORDS = 20000
_ROLES = {"system": 2, "user": 3, "assistant": 4}


def _ids(text: str) -> list[int]:
    """A vocabulary word `wN` is token 100 + N; the workloads' few fixed words (`Tool result:`) hash."""
    return [100 + int(w[1:]) if w[:1] == "w" and w[1:].isdigit() else 30_000 + zlib.crc32(w.encode()) % 10_000
            for w in text.split()]


def render(r: Request) -> list[int]:
    """Token ids of a request: one per word, chat messages between fixed role tokens."""
    if r.messages is None:
        return _ids(r.prompt or "")
    out: list[int] = []
    for m in r.messages:
        out += [1, _ROLES.get(m["role"], 5), *_ids(m["content"]), 9]
    return [*out, 1, _ROLES["assistant"]]


def sessions(reqs: list[Request]) -> list[Session]:
    """Open loop, as the live client: each request is its own session, sent at its arrival time."""
    return [Session(f"r{i}", r.arrival_s, turns_of([Turn(render(r), r.max_tokens)])) for i, r in enumerate(reqs)]


def run_cell(name: str, rate: float, policy: str, args: argparse.Namespace, vocab: Vocab) -> dict[str, Any]:
    reqs = WORKLOADS[name](vocab, rate, args.duration_s, args.seed)
    cfg = FleetConfig(workers=args.workers, profile="vllm-cpu-smollm2-135m", block_size=32,
                      num_gpu_blocks=46592 // 32, max_model_len=8192)
    chooser: Chooser = CacheAwareModel() if policy == "cache_aware_model" else policy_chooser(policy)
    t0 = time.perf_counter()
    res = VirtualFleet(cfg).run(sessions(reqs), chooser)
    ttft = sorted(r.ttft_s for r in res.requests if r.ttft_s is not None)
    busy = [w.busy_s for w in res.workers]
    prompt = sum(r.prompt_tokens for r in res.requests)
    return {"workload": name, "rate_rps": rate, "policy": policy, "requests": len(reqs), "answered": len(ttft),
            "goodput_rps": sum(t <= args.slo_ttft_s for t in ttft) / args.duration_s,
            "ttft_p50_s": ttft[len(ttft) // 2], "ttft_p99_s": ttft[int(len(ttft) * 0.99)],
            "hit_rate": sum(r.cached_tokens for r in res.requests) / max(1, prompt),
            "imbalance_busy": max(busy) / (sum(busy) / len(busy)) if sum(busy) else 1.0,
            "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--cells", default=",".join(f"{w}:{lvl}" for w in RATES for lvl in ("low", "high")),
                   help="workload:level pairs (level low or high, the live bench's rates)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=REPORT)
    args = p.parse_args()
    vocab = Vocab([f" w{i}" for i in range(_WORDS)])
    rows = []
    for cell in args.cells.split(","):
        name, level = cell.split(":")
        rate = RATES[name][("low", "high").index(level)] * args.workers / 8
        for policy in args.policies.split(","):
            row = run_cell(name, rate, policy, args, vocab)
            row["rate_level"] = level
            rows.append(row)
            print(f"{name:9s} {level:4s} {rate:5.1f}/s {policy:17s} good {row['goodput_rps']:6.2f}/s "
                  f"p50 {row['ttft_p50_s']:.2f} p99 {row['ttft_p99_s']:.2f} s hit {row['hit_rate']:.2f} "
                  f"imb {row['imbalance_busy']:.2f} ({row['wall_s']} s)", flush=True)
    report = {"benchmark": "the live routing cells in virtual time (no gateway, no sockets)",
              "workers": args.workers, "profile": "vllm-cpu-smollm2-135m", "block_size": 32,
              "kv_tokens_per_worker": 46592, "duration_s": args.duration_s, "slo_ttft_s": args.slo_ttft_s,
              "seed": args.seed, "rates_at_8_workers": RATES, "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
