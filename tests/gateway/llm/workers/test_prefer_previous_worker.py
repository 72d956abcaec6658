"""A conversation's previous worker is preferred unless the cost model predicts another clearly faster
(`gateway.llm.workers.pool._prefer`, used for Responses `previous_response_id`)."""

from __future__ import annotations

from typing import Any

from gateway.llm.targets import Target
from gateway.llm.workers.pool import PREFER_SLACK_RATIO, PREFER_SLACK_S, _prefer
from router import Candidate


def ranked(*costs: tuple[str, float]) -> tuple[list[Target], list[Candidate]]:
    engine: Any = object()
    return ([Target(name, engine, reason="load") for name, _ in costs],
            [Candidate(name, 0, cost, "load") for name, cost in costs])


def test_the_previous_worker_comes_first_when_it_is_about_as_fast() -> None:
    targets, cands = ranked(("a", 0.10), ("b", 0.12))
    out = _prefer(targets, cands, "b")
    assert [t.name for t in out] == ["b", "a"] and out[0].reason == "previous_response"


def test_the_cost_model_wins_when_the_previous_worker_is_clearly_slower() -> None:
    slow = 0.10 * (1 + PREFER_SLACK_RATIO) + PREFER_SLACK_S + 0.01
    targets, cands = ranked(("a", 0.10), ("b", slow))
    assert [t.name for t in _prefer(targets, cands, "b")] == ["a", "b"]


def test_a_previous_worker_that_is_gone_or_first_changes_nothing() -> None:
    targets, cands = ranked(("a", 0.1), ("b", 0.1))
    assert _prefer(targets, cands, "gone") == targets
    assert _prefer(targets, cands, "a") == targets
