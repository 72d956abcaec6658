"""The time of one routing decision: `Router.rank` for a long prompt over many workers, index populated.

Default: 64 workers with 16-token blocks and an 8,192-token prompt (512 blocks). The index is
filled through the router's own KV-event path (`router.feed.apply_kv_events` with vLLM
`BlockStored` events, as the ZMQ subscriber applies them), so every worker holds exact entries:

- every worker holds a shared 2,048-token "system prompt" (128 blocks) and `--docs-per-worker`
  documents of its own (each `--doc-tokens` long) after it;
- the measured prompt is the system prompt plus one worker's document plus a new question, so one
  worker matches 6,144 tokens (384 blocks), the others 2,048.

Measured per policy (`prefix`, `least_load`, `round_robin`): `rank()` alone, and `rank()` +
`on_dispatch` + `on_finish` (the whole routing bookkeeping of one request), over `--iterations`
calls with distinct request ids; also `block_hashes` alone (the key) and `index.match`'s share.
p50, p99 and mean in microseconds, JSON in loadtests/reports/route_decision.json.

    .venv/bin/python loadtests/routing/bench_decision.py [--workers 64 --block-size 16 --prompt-tokens 8192]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from router import Router, RouterConfig, WorkerInfo
from router.index.events import BlockStored
from router.index.hashing import block_hashes, root_hash

REPORT = ROOT / "loadtests" / "reports" / "route_decision.json"
MODEL = "m"


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 49152) for _ in range(n)]


def _store(router: Router, worker: str, tokens: list[int], block_size: int, engine_ids: list[int]) -> None:
    """Announce `tokens`' full blocks on `worker` as one vLLM BlockStored event (engine hashes are opaque)."""
    n = len(tokens) // block_size
    hashes = tuple(engine_ids.pop() for _ in range(n))
    router.feed.apply_kv_events(worker, [BlockStored(hashes, None, tuple(tokens[: n * block_size]), block_size)])


def build(workers: int, block_size: int, system_tokens: int, doc_tokens: int, docs_per_worker: int,
          seed: int) -> tuple[Router, list[int], list[list[int]]]:
    rng = random.Random(seed)
    router = Router(RouterConfig(policy="prefix", max_blocks_per_worker=1 << 20))
    system = _tokens(rng, system_tokens)
    engine_ids = list(range(1, 1 << 24))
    docs: list[list[int]] = []
    for w in range(workers):
        name = f"w{w:03d}"
        router.add_worker(WorkerInfo(name, f"http://127.0.0.1:{9000 + w}", (MODEL,), block_size=block_size,
                                     kv_events_endpoint=f"tcp://127.0.0.1:{20000 + w}"))
        for _ in range(docs_per_worker):
            doc = _tokens(rng, doc_tokens)
            docs.append(doc)
            # vLLM announces a request's blocks in chain order; one event with the whole chain.
            _store(router, name, system + doc, block_size, engine_ids)
    return router, system, docs


def _stats(samples_s: list[float]) -> dict[str, float]:
    us = sorted(s * 1e6 for s in samples_s)
    return {"p50_us": round(statistics.median(us), 1), "p99_us": round(us[int(0.99 * (len(us) - 1))], 1),
            "mean_us": round(statistics.fmean(us), 1), "n": len(us)}


def measure(router: Router, prompts: list[list[int]], iterations: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for policy in ("prefix", "least_load", "round_robin"):
        rank_s, full_s = [], []
        for i in range(iterations):
            prompt = prompts[i % len(prompts)]
            t0 = time.perf_counter()
            ranking = router.rank(MODEL, prompt, policy=policy)
            t1 = time.perf_counter()
            rid = f"{policy}-{i}"
            router.on_dispatch(rid, ranking, ranking.candidates[0].worker)
            router.on_finish(rid, cached_tokens=ranking.candidates[0].predicted_cached_tokens)
            t2 = time.perf_counter()
            rank_s.append(t1 - t0)
            full_s.append(t2 - t0)
        out[policy] = {"rank": _stats(rank_s), "rank_dispatch_finish": _stats(full_s),
                       "top_reason_example": ranking.candidates[0].reason,
                       "top_predicted_cached_tokens": ranking.candidates[0].predicted_cached_tokens}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=8192)
    p.add_argument("--system-tokens", type=int, default=2048)
    p.add_argument("--doc-tokens", type=int, default=4096)
    p.add_argument("--docs-per-worker", type=int, default=4)
    p.add_argument("--iterations", type=int, default=400)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--label", default="current", help="name of this run in the report (e.g. before/after)")
    p.add_argument("--out", type=Path, default=REPORT)
    args = p.parse_args()
    t0 = time.perf_counter()
    router, system, docs = build(args.workers, args.block_size, args.system_tokens, args.doc_tokens,
                                 args.docs_per_worker, args.seed)
    build_s = time.perf_counter() - t0
    rng = random.Random(args.seed + 1)
    tail = args.prompt_tokens - args.system_tokens - args.doc_tokens
    prompts = [system + doc + _tokens(rng, tail) for doc in rng.sample(docs, 16)]
    root = root_hash(MODEL)
    hash_s = []
    for i in range(args.iterations):
        t = time.perf_counter()
        block_hashes(prompts[i % len(prompts)], args.block_size, root)
        hash_s.append(time.perf_counter() - t)
    result = {"label": args.label, "workers": args.workers, "block_size": args.block_size,
              "prompt_tokens": args.prompt_tokens, "prompt_blocks": args.prompt_tokens // args.block_size,
              "index": {"system_tokens": args.system_tokens, "doc_tokens": args.doc_tokens,
                        "docs_per_worker": args.docs_per_worker,
                        "blocks_per_worker": args.docs_per_worker * (args.system_tokens + args.doc_tokens)
                        // args.block_size, "build_s": round(build_s, 2)},
              "block_hashes": _stats(hash_s), "policies": measure(router, prompts, args.iterations),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "loadavg": os.getloadavg()}}
    report = json.loads(args.out.read_text()) if args.out.is_file() else {}
    report.setdefault("runs", {})[args.label] = result
    report["benchmark"] = "one routing decision: Router.rank (and rank + on_dispatch + on_finish), populated index"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
