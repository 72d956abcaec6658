"""Routing baselines that exist in the experiments only, not as shipped policies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from router import Ranking, Router


def longest_prefix(router: Router, model: str, prompt: Sequence[int], session_key: str) -> Ranking:
    """Always the worker with the longest cached prefix; ties (no cache anywhere, or several
    workers with the same prefix) go to the least loaded. This is what a router does that treats
    cache hits as free: a trace whose requests share their first blocks all goes to one worker."""
    by_load = router.rank(model, prompt, policy="least_load")
    ordered = sorted(by_load.candidates, key=lambda c: -c.predicted_cached_tokens)  # stable: load breaks ties
    return replace(by_load, policy="longest_prefix", candidates=tuple(ordered))


BASELINES = {"longest_prefix": longest_prefix}
