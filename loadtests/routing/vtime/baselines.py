"""Routing baselines that exist in the experiments only, not as shipped policies.

- `longest_prefix`: always the longest cached prefix, ties by load (what a router does that
  treats cache hits as free).
- `CacheAwareModel`: a **model** of vllm-router's `cache_aware` policy (PyPI `vllm-router`,
  inherited from SGLang's router), written here from its documented algorithm, not its code.
  Per worker it keeps an approximate tree of the prompts it was sent (here: the set of the
  prompts' 16-token block-chain hashes, never evicted, standing for a tree that is pruned
  only every 30 s down to 10,000 nodes). The load is each worker's requests in flight. The
  fleet is *imbalanced* when ``max - min > balance_abs_threshold`` (64) **and**
  ``max > balance_rel_threshold × min`` (1.5): then the least-loaded worker gets the request.
  Otherwise the worker with the longest match gets it when its match ratio (matched tokens
  over prompt tokens) exceeds `cache_threshold` (0.3), else the worker with the smallest tree.
  The thresholds are the defaults vllm-router 0.1.17 reports when it starts (the live
  experiments run it with them); SGLang's router documents 0.5, 32 and 1.1.
  The real router matches characters of the text; this model matches tokens at 16-token
  granularity, and it sees in-flight counts exactly, as the real one does from its own proxy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from router import Ranking, Router
from router.index.hashing import block_hashes, root_hash

_MATCH_BLOCK = 16


def longest_prefix(router: Router, model: str, prompt: Sequence[int], session_key: str) -> Ranking:
    """Always the worker with the longest cached prefix; ties (no cache anywhere, or several
    workers with the same prefix) go to the least loaded. This is what a router does that treats
    cache hits as free: a trace whose requests share their first blocks all goes to one worker."""
    by_load = router.rank(model, prompt, policy="least_load")
    ordered = sorted(by_load.candidates, key=lambda c: -c.predicted_cached_tokens)  # stable: load breaks ties
    return replace(by_load, policy="longest_prefix", candidates=tuple(ordered))


@dataclass
class CacheAwareModel:
    """A chooser (see `fleet.Chooser`) modelling vllm-router's `cache_aware`; one per run."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    trees: dict[str, set[int]] = field(default_factory=dict)

    def __call__(self, router: Router, model: str, prompt: Sequence[int], session_key: str) -> Ranking:
        base = router.rank(model, prompt, policy="round_robin")  # the router's views, in no cache order
        load = {w.name: w.in_flight for w in router.workers()}
        names = [c.worker for c in base.candidates]
        chain = block_hashes(prompt, _MATCH_BLOCK, root_hash(model))
        chosen = self.choose(names, load, chain, len(prompt))
        self.trees.setdefault(chosen, set()).update(chain)
        first = next(c for c in base.candidates if c.worker == chosen)
        rest = tuple(c for c in base.candidates if c.worker != chosen)
        return replace(base, policy="cache_aware_model", candidates=(first, *rest))

    def choose(self, names: Sequence[str], load: dict[str, int], chain: Sequence[int], prompt_tokens: int) -> str:
        loads = [load.get(n, 0) for n in names]
        hi, lo = max(loads), min(loads)
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            return min(names, key=lambda n: load.get(n, 0))
        best, best_match = names[0], -1
        for n in names:
            tree = self.trees.get(n)
            m = 0
            if tree:
                for h in chain:
                    if h not in tree:
                        break
                    m += 1
            if m > best_match:
                best, best_match = n, m
        if prompt_tokens and best_match * _MATCH_BLOCK / prompt_tokens > self.cache_threshold:
            return best
        return min(names, key=lambda n: len(self.trees.get(n, ())))


BASELINES = {"longest_prefix": longest_prefix}
