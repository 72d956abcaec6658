"""Routing policies: pure functions from per-worker views to an ordered ranking.

Every policy returns *all* candidate workers, best first, so that a request
that fails before its first byte retries on the next one and keeps as much
affinity as possible. Workers that are not available (breaker open, failing
health checks) come last with reason ``degraded``: trying them beats failing
outright when nothing else is left. Draining workers are never passed in.

Reasons are a small fixed set, used as a metric label:
``prefix_hit`` (the chosen worker has the longest cached prefix), ``load``
(a worker with more cache lost on load), ``no_prefix`` (no worker has any of
the prompt), ``least_load``, ``round_robin``, ``session``, ``session_no_key``
(session policy without a key: fell back to prefix), ``degraded``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from router.config import CostWeights
from router.hashing import rendezvous_score
from router.load import LoadSnapshot


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What a policy may know about one worker for one request."""

    name: str
    predicted_cached_tokens: int  # tokens the engine should serve from cache
    load: LoadSnapshot
    available: bool = True


@dataclass(frozen=True, slots=True)
class Candidate:
    worker: str
    predicted_cached_tokens: int
    cost: float  # token-equivalents for prefix/least_load; rank position otherwise
    reason: str


def load_cost(load: LoadSnapshot, w: CostWeights) -> float:
    """Load part of the cost, in token-equivalents."""
    return (w.queued_prefill * load.queued_prefill_tokens
            + w.request * load.requests
            + w.kv_usage * (load.kv_usage or 0.0))


def _split(views: Sequence[WorkerView]) -> tuple[list[WorkerView], list[WorkerView]]:
    return [v for v in views if v.available], [v for v in views if not v.available]


def _degraded(views: Sequence[WorkerView], tie_key: str | int) -> list[Candidate]:
    ordered = sorted(views, key=lambda v: -rendezvous_score(tie_key, v.name))
    return [Candidate(v.name, v.predicted_cached_tokens, float("inf"), "degraded") for v in ordered]


def rank_prefix(views: Sequence[WorkerView], prompt_tokens: int, w: CostWeights,
                tie_key: str | int) -> list[Candidate]:
    """Cheapest first: uncached prefill tokens x weight + load.

    Ties (same cost and cached tokens; typical when idle) are broken by a
    rendezvous hash of `tie_key`, so distinct prompts spread over workers
    deterministically instead of piling onto the first name.
    """
    ok, bad = _split(views)
    best_cached = max((v.predicted_cached_tokens for v in ok), default=0)
    scored = []
    for v in ok:
        cost = w.prefill * max(0, prompt_tokens - v.predicted_cached_tokens) + load_cost(v.load, w)
        scored.append((cost, -v.predicted_cached_tokens, -rendezvous_score(tie_key, v.name), v))
    scored.sort(key=lambda t: t[:3])
    out = []
    for cost, _, _, v in scored:
        if best_cached == 0:
            reason = "no_prefix"
        elif v.predicted_cached_tokens == best_cached:
            reason = "prefix_hit"
        else:
            reason = "load"
        out.append(Candidate(v.name, v.predicted_cached_tokens, cost, reason))
    return out + _degraded(bad, tie_key)


def rank_least_load(views: Sequence[WorkerView], w: CostWeights, tie_key: str | int) -> list[Candidate]:
    ok, bad = _split(views)
    scored = sorted(ok, key=lambda v: (load_cost(v.load, w), -rendezvous_score(tie_key, v.name)))
    return [Candidate(v.name, v.predicted_cached_tokens, load_cost(v.load, w), "least_load")
            for v in scored] + _degraded(bad, tie_key)


def rank_round_robin(views: Sequence[WorkerView], turn: int) -> list[Candidate]:
    """Rotate the available workers (sorted by name) by `turn`."""
    ok, bad = _split(views)
    ok.sort(key=lambda v: v.name)
    if ok:
        k = turn % len(ok)
        ok = ok[k:] + ok[:k]
    return [Candidate(v.name, v.predicted_cached_tokens, float(i), "round_robin")
            for i, v in enumerate(ok)] + _degraded(bad, turn)


def rank_session(views: Sequence[WorkerView], session_key: str) -> list[Candidate]:
    """Consistent hash of the session key: same key, same order, on every replica."""
    ok, bad = _split(views)
    ok.sort(key=lambda v: -rendezvous_score(session_key, v.name))
    return [Candidate(v.name, v.predicted_cached_tokens, float(i), "session")
            for i, v in enumerate(ok)] + _degraded(bad, session_key)


def rank(policy: str, views: Sequence[WorkerView], *, prompt_tokens: int, weights: CostWeights,
         tie_key: str | int, turn: int = 0, session_key: str | None = None) -> list[Candidate]:
    """Dispatch to one policy. Raises ValueError for an unknown policy name."""
    if policy == "prefix":
        return rank_prefix(views, prompt_tokens, weights, tie_key)
    if policy == "least_load":
        return rank_least_load(views, weights, tie_key)
    if policy == "round_robin":
        return rank_round_robin(views, turn)
    if policy == "session":
        if session_key:
            return rank_session(views, session_key)
        ranked = rank_prefix(views, prompt_tokens, weights, tie_key)
        return [c if c.reason == "degraded" else Candidate(c.worker, c.predicted_cached_tokens, c.cost,
                                                           "session_no_key") for c in ranked]
    raise ValueError(f"unknown routing policy {policy!r}")
