from __future__ import annotations

import pytest

from router.config import CostWeights
from router.load import LoadSnapshot
from router.policies import WorkerView, load_cost, rank

W = CostWeights()


def view(name, cached=0, available=True, **load):
    return WorkerView(name, cached, LoadSnapshot(**load), available)


def names(cands):
    return [c.worker for c in cands]


def test_prefix_prefers_cached_worker():
    out = rank("prefix", [view("a"), view("b", cached=512)], prompt_tokens=600, weights=W, tie_key=1)
    assert names(out) == ["b", "a"]
    assert out[0].reason == "prefix_hit" and out[0].predicted_cached_tokens == 512
    assert out[0].cost == pytest.approx(88) and out[1].cost == pytest.approx(600)
    assert out[1].reason == "load"


def test_prefix_load_can_override_affinity():
    busy = view("b", cached=128, in_flight=10)
    out = rank("prefix", [view("a"), busy], prompt_tokens=600, weights=W, tie_key=1)
    assert names(out) == ["a", "b"]
    assert out[0].reason == "load"


def test_prefix_ties_spread_by_prompt_key():
    firsts = {rank("prefix", [view("a"), view("b"), view("c")], prompt_tokens=10, weights=W,
                   tie_key=k)[0].worker for k in range(60)}
    assert firsts == {"a", "b", "c"}
    out = rank("prefix", [view("a"), view("b")], prompt_tokens=10, weights=W, tie_key=7)
    assert out[0].reason == "no_prefix"


def test_unavailable_workers_rank_last_as_degraded():
    out = rank("prefix", [view("a", cached=900, available=False), view("b")], prompt_tokens=1000,
               weights=W, tie_key=3)
    assert names(out) == ["b", "a"] and out[1].reason == "degraded"


def test_load_cost_uses_larger_of_tracked_and_scraped():
    assert load_cost(LoadSnapshot(in_flight=1, running=3, waiting=2), W) == pytest.approx(5 * 64)
    assert load_cost(LoadSnapshot(queued_prefill_tokens=100, kv_usage=0.5), W) == pytest.approx(356)


def test_least_load_ignores_cache():
    out = rank("least_load", [view("a", cached=1000, in_flight=2), view("b", in_flight=1)],
               prompt_tokens=1100, weights=W, tie_key=1)
    assert names(out) == ["b", "a"] and out[0].reason == "least_load"
    assert out[1].predicted_cached_tokens == 1000  # still reported, for the closed loop


def test_round_robin_rotates():
    vs = [view("c"), view("a"), view("b")]
    firsts = [rank("round_robin", vs, prompt_tokens=1, weights=W, tie_key=0, turn=t)[0].worker
              for t in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]


def test_session_is_consistent_and_falls_back_without_key():
    vs = [view("a"), view("b"), view("c")]
    one = rank("session", vs, prompt_tokens=1, weights=W, tie_key=0, session_key="user-1")
    again = rank("session", list(reversed(vs)), prompt_tokens=1, weights=W, tie_key=99, session_key="user-1")
    assert names(one) == names(again) and one[0].reason == "session"
    # Removing a worker that is not the session's first choice keeps the choice.
    others = [v for v in vs if v.name != one[-1].worker]
    assert rank("session", others, prompt_tokens=1, weights=W, tie_key=0, session_key="user-1")[0].worker \
        == one[0].worker
    firsts = {rank("session", vs, prompt_tokens=1, weights=W, tie_key=0, session_key=f"s{i}")[0].worker
              for i in range(60)}
    assert firsts == {"a", "b", "c"}
    fb = rank("session", [view("a"), view("b", cached=256)], prompt_tokens=300, weights=W, tie_key=0)
    assert fb[0].worker == "b" and fb[0].reason == "session_no_key"


def test_unknown_policy():
    with pytest.raises(ValueError):
        rank("random", [view("a")], prompt_tokens=1, weights=W, tie_key=0)
