"""Routing policies: pure functions from per-worker views to an ordered ranking.

Every policy returns *all* candidate workers, best first, so that a request
that fails before its first byte retries on the next one and keeps as much
affinity as possible. Workers that are not available (breaker open, failing
health checks) come last with reason ``degraded``: trying them beats failing
outright when nothing else is left. Draining workers are never passed in.

`prefix` and `least_load` rank by a cost in seconds (`router.cost`): the
worker's predicted time to first token for this request, plus, for `prefix`,
the expected refill time of what it would evict, how much longer its answer
decodes there, and the delay its prefill adds to the requests already running
there. `least_load` prices every
worker as if none held the prompt. Every candidate carries its predicted TTFT,
whatever the policy, so that predictions can be checked against what happens.

Reasons are a small fixed set, used as a metric label:
``prefix_hit`` (the chosen worker has the longest cached prefix), ``load``
(a worker with more cache lost on load), ``no_prefix`` (no worker has more of
the prompt than the cost's error: ranked as ``least_load``), ``least_load``,
``round_robin``, ``session``, ``session_no_key`` (session policy without a
key: fell back to prefix), ``degraded``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from router.config import TtftModel
from router.cost import KvPressure, decode_s, delay_s, eviction_s, features, predict_ttft
from router.index.hashing import rendezvous_score
from router.telemetry.load import LoadSnapshot

DEFAULT_MODEL = TtftModel()
# A hit on more than this share of the prompt is always worth keeping, however large the model's error
# (on a starved machine it neared 1, and every follow-up turn of a conversation was ranked `no_prefix`).
MAX_NEGLIGIBLE_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What a policy may know about one worker for one request."""

    name: str
    predicted_cached_tokens: int  # tokens the engine should serve from cache
    load: LoadSnapshot
    available: bool = True
    model: TtftModel = DEFAULT_MODEL  # the worker's learned cost coefficients
    kv: KvPressure | None = None  # None: its KV pressure is unknown (no capacity, no events)
    max_num_seqs: int | None = None  # its batch bound (None: unknown)

    @property
    def full(self) -> bool:
        """Its batch is full: a request sent now waits in the engine for a running one to end."""
        return self.max_num_seqs is not None and self.load.requests >= self.max_num_seqs


@dataclass(frozen=True, slots=True)
class Candidate:
    worker: str
    predicted_cached_tokens: int
    cost: float  # seconds for prefix/least_load; rank position otherwise
    reason: str
    predicted_ttft_s: float = 0.0  # the cost model's TTFT for this request on this worker


def view_ttft(v: WorkerView, prompt_tokens: int, cached: int | None = None) -> float:
    """Predicted seconds to first token of a `prompt_tokens` prompt on `v` (with its cached prefix,
    or `cached` tokens)."""
    c = v.predicted_cached_tokens if cached is None else cached
    u = max(0, prompt_tokens - c)
    return predict_ttft(v.model, features(v.load, u, c))


def assigned_s(v: WorkerView) -> float:
    """Seconds of prefill the worker was sent so far, priced with its own model."""
    return v.model.token_s * v.load.assigned_prefill_tokens + v.model.pair_s * v.load.assigned_prefill_pairs


def _split(views: Sequence[WorkerView]) -> tuple[list[WorkerView], list[WorkerView]]:
    return [v for v in views if v.available], [v for v in views if not v.available]


def _degraded(views: Sequence[WorkerView], tie_key: str | int, n: int) -> list[Candidate]:
    ordered = sorted(views, key=lambda v: -rendezvous_score(tie_key, v.name))
    return [Candidate(v.name, v.predicted_cached_tokens, float("inf"), "degraded", view_ttft(v, n))
            for v in ordered]


def _ordered(scored: list[tuple[float, int, WorkerView]], tie_key: str | int,
             tolerance: float, fewest_running: bool = False) -> list[tuple[float, int, WorkerView]]:
    """Cheapest first. Workers whose cost is within `tolerance` (relative) of the cheapest are a tie:
    a difference smaller than the cost model's own error says nothing. Ties go to the worker with
    more cached tokens, then to the one with the fewest prefill tokens queued (dispatched, no first
    token yet: a request sent there waits for them, however the model prices them), then to the
    one that was sent the least prefill work so far (so that work spreads evenly where latency
    does not care, instead of piling onto whichever looks a hair cheaper), then to a rendezvous
    hash of `tie_key`. Before all of that, a tie never goes to a worker whose batch is full (the
    engine queues it for a slot: a wait of part of an answer that the TTFT fit, linear in the load,
    does not see) while one with room is in it. With `fewest_running` (least_load: the policy *is* the
    load), the one running the fewest requests comes before the work-sent-so-far rule: a count every
    frontend and replica shares, where work sent so far is this process's own. The rest follow by cost."""
    if not scored:
        return scored
    best = min(t[0] for t in scored)
    bound = best + tolerance * abs(best)
    head = [t for t in scored if t[0] <= bound]
    rest = [t for t in scored if t[0] > bound]
    head.sort(key=lambda t: (t[2].full, t[1], t[2].load.queued_prefill_tokens,
                             t[2].load.requests if fewest_running else 0, assigned_s(t[2]),
                             -rendezvous_score(tie_key, t[2].name)))
    rest.sort(key=lambda t: (t[0], t[1]))
    return head + rest


def rank_prefix(views: Sequence[WorkerView], prompt_tokens: int, tie_key: str | int,
                tolerance: float = 0.0, answer_tokens: float = 0.0) -> list[Candidate]:
    """Cheapest first: predicted TTFT on the worker, plus the refill time of what it would evict,
    plus how much longer an answer of `answer_tokens` decodes there, plus what its prefill delays
    the worker's running requests.

    Where no worker holds more than a `tolerance` share of the prompt (none at all, in particular;
    never more than `MAX_NEGLIGIBLE_SHARE`, since a model whose error is large on an overloaded
    fleet says nothing about whether most of a prompt's prefill can be skipped),
    what a hit would save is within the cost's own error, and the cost is `least_load`'s (the
    whole prompt's TTFT) plus the eviction term, with reason ``no_prefix``: the decode and delay
    terms weigh a hit against the batch it joins, and without one they would only reprice the
    load with the coefficients the fit is least sure of (on prompts of one length it cannot tell
    the latency from the per-token cost)."""
    ok, bad = _split(views)
    best_cached = max((v.predicted_cached_tokens for v in ok), default=0)
    negligible = best_cached <= min(tolerance, MAX_NEGLIGIBLE_SHARE) * prompt_tokens
    scored = []
    ttft: dict[str, float] = {}
    for v in ok:
        t = ttft[v.name] = view_ttft(v, prompt_tokens)
        if negligible:
            cold = t if v.predicted_cached_tokens == 0 else view_ttft(v, prompt_tokens, cached=0)
            cost = cold + eviction_s(v.model, v.kv, prompt_tokens)
            scored.append((cost, 0, v))
            continue
        u = max(0, prompt_tokens - v.predicted_cached_tokens)
        cost = (t + eviction_s(v.model, v.kv, u) + decode_s(v.model, v.load, answer_tokens)
                + delay_s(v.model, v.load, u, v.predicted_cached_tokens))
        scored.append((cost, -v.predicted_cached_tokens, v))
    out = []
    for cost, _, v in _ordered(scored, tie_key, tolerance):
        reason = ("no_prefix" if negligible else "prefix_hit" if v.predicted_cached_tokens == best_cached
                  else "load")
        out.append(Candidate(v.name, v.predicted_cached_tokens, cost, reason, ttft[v.name]))
    return out + _degraded(bad, tie_key, prompt_tokens)


def rank_least_load(views: Sequence[WorkerView], prompt_tokens: int, tie_key: str | int,
                    tolerance: float = 0.0) -> list[Candidate]:
    """Cheapest first by the predicted TTFT of the whole prompt: the load terms, blind to the cache."""
    ok, bad = _split(views)
    scored = [(view_ttft(v, prompt_tokens, cached=0), 0, v) for v in ok]
    return [Candidate(v.name, v.predicted_cached_tokens, cost, "least_load",
                      cost if v.predicted_cached_tokens == 0 else view_ttft(v, prompt_tokens))
            for cost, _, v in _ordered(scored, tie_key, tolerance, fewest_running=True)] \
        + _degraded(bad, tie_key, prompt_tokens)


def rank_round_robin(views: Sequence[WorkerView], prompt_tokens: int, turn: int) -> list[Candidate]:
    """Rotate the available workers (sorted by name) by `turn`."""
    ok, bad = _split(views)
    ok.sort(key=lambda v: v.name)
    if ok:
        k = turn % len(ok)
        ok = ok[k:] + ok[:k]
    return [Candidate(v.name, v.predicted_cached_tokens, float(i), "round_robin", view_ttft(v, prompt_tokens))
            for i, v in enumerate(ok)] + _degraded(bad, turn, prompt_tokens)


def rank_session(views: Sequence[WorkerView], prompt_tokens: int, session_key: str) -> list[Candidate]:
    """Consistent hash of the session key: same key, same order, on every replica."""
    ok, bad = _split(views)
    ok.sort(key=lambda v: -rendezvous_score(session_key, v.name))
    return [Candidate(v.name, v.predicted_cached_tokens, float(i), "session", view_ttft(v, prompt_tokens))
            for i, v in enumerate(ok)] + _degraded(bad, session_key, prompt_tokens)


def rank(policy: str, views: Sequence[WorkerView], *, prompt_tokens: int, tie_key: str | int, turn: int = 0,
         session_key: str | None = None, tolerance: float = 0.0, answer_tokens: float = 0.0) -> list[Candidate]:
    """Dispatch to one policy. `tolerance` is the relative cost difference below which `prefix` and
    `least_load` call workers equal (the cost model's typical error); `answer_tokens` is the
    model's mean answer length, for `prefix`'s decode term. Raises ValueError for an unknown
    policy name."""
    if policy == "prefix":
        return rank_prefix(views, prompt_tokens, tie_key, tolerance, answer_tokens)
    if policy == "least_load":
        return rank_least_load(views, prompt_tokens, tie_key, tolerance)
    if policy == "round_robin":
        return rank_round_robin(views, prompt_tokens, turn)
    if policy == "session":
        if session_key:
            return rank_session(views, prompt_tokens, session_key)
        ranked = rank_prefix(views, prompt_tokens, tie_key, tolerance, answer_tokens)
        return [c if c.reason == "degraded" else Candidate(c.worker, c.predicted_cached_tokens, c.cost,
                                                           "session_no_key", c.predicted_ttft_s) for c in ranked]
    raise ValueError(f"unknown routing policy {policy!r}")
