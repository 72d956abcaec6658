"""The cost of isolating tenants' prefix caches, on the Mooncake trace in virtual time.

The gateway gives every tenant its own prefix-cache namespace (`gateway.security.tenancy`:
a salt the engine mixes into the first KV block's hash and the router into its own). A
prefix that several tenants send is then cached, and computed, once per tenant. This
replays the trace (/work/shared/traces, see its README) over `--workers` sim engines behind
the real router (`prefix` policy, `loadtests/routing/vtime`), its requests spread over N
tenants, with isolation off (one shared namespace) and on (the gateway's own salts):

- `by_group`: a conversation (the trace's first hash id: every request that shares a
  prefix with another shares its first block) belongs to one tenant. Isolation can split no
  shared prefix, so what differs from "off" is the routing's own variation (timing moves requests
  between workers): a check that salting itself loses no hit.
- `by_request`: each request's tenant is drawn on its own (seeded), as when many tenants
  send the same popular prefixes: the worst case for isolation.

Reported per run: hit rate (prompt tokens served from cache), the upper bound (one worker with
an infinite cache, within each namespace: `by_group` keeps the bound of "off", `by_request`
lowers it) and the hit rate's fraction of it, TTFT p50/p99. JSON in
loadtests/reports/tenant_isolation.json.

    .venv/bin/python loadtests/routing/bench_tenants.py            # ~3 min on 2 cores
    .venv/bin/python loadtests/routing/bench_tenants.py --trace-limit 500 --out /tmp/x   # quick
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gateway.security.tenancy import CacheNamespaces
from loadtests.routing.vtime import mooncake
from loadtests.routing.vtime.fleet import FleetConfig, VirtualFleet, policy_chooser
from loadtests.routing.vtime.sessions import Session
from loadtests.routing.vtime.stats import summarize

REPORT = ROOT / "loadtests" / "reports" / "tenant_isolation.json"
_KEPT = ("requests", "hit_rate", "upper_bound_hit_rate", "hit_fraction_of_bound", "ttft_p50_s", "ttft_p99_s",
         "imbalance_busy", "wall_s")


def assign(sessions: list[Session], tenants: int, how: str, seed: int) -> list[Session]:
    """The sessions salted as the gateway salts its tenants' requests (tenant `t<i>`)."""
    ns = CacheNamespaces({f"t{i}": f"t{i}" for i in range(tenants)})
    rng = random.Random(seed)
    out = []
    for s in sessions:
        i = rng.randrange(tenants) if how == "by_request" else random.Random(s.routing_key).randrange(tenants)
        out.append(dataclasses.replace(s, cache_salt=ns.salt(f"t{i}")))
    return out


def run(sessions: list[Session], args: argparse.Namespace) -> dict[str, Any]:
    fleet = VirtualFleet(FleetConfig(workers=args.workers, profile=args.profile, max_model_len=args.max_model_len))
    row = summarize(fleet.run(sessions, policy_chooser("prefix")), args.slo_s)
    return {k: row[k] for k in _KEPT}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--profile", default="vllm-cpu-tiny-llama")
    ap.add_argument("--tenants", type=int, nargs="+", default=[8])
    ap.add_argument("--trace-limit", type=int, default=2000, help="the trace's first N requests (memory: ~1 GB)")
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--slo-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=REPORT)
    args = ap.parse_args()
    rows = mooncake.load()

    def fresh() -> list[Session]:  # a session's turns are used up by the run that replays it
        return mooncake.sessions(rows, max_model_len=args.max_model_len, limit=args.trace_limit)

    report: dict[str, Any] = {"trace": str(mooncake.TRACE), "workers": args.workers, "profile": args.profile,
                              "policy": "prefix",
                              "requests": len(fresh()), "isolation_off": run(fresh(), args), "isolation_on": {}}
    off = report["isolation_off"]["hit_rate"]
    print(f"isolation off: hit rate {off:.4f}", flush=True)
    for n in args.tenants:
        for how in ("by_group", "by_request"):
            row = run(assign(fresh(), n, how, args.seed), args)
            row["hit_rate_change"] = row["hit_rate"] - off
            report["isolation_on"][f"{n}_tenants_{how}"] = row
            print(f"isolation on, {n} tenants {how}: hit rate {row['hit_rate']:.4f} ({row['hit_rate_change']:+.4f})",
                  flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
