"""The fair queue's order and weights, exactly (pure: no clock, no loop)."""

from __future__ import annotations

import pytest

from gateway.llm.admission.fair import FairQueue, Waiter


def drain(q: FairQueue) -> list[str]:
    """Admit everything in order; returns the tenants in admission order."""
    out = []
    while (w := q.peek()) is not None:
        q.remove(w)
        q.admitted(w)
        out.append(w.tenant)
    return out


def test_equal_weights_alternate_by_tokens_not_by_requests() -> None:
    q = FairQueue(3)
    for _ in range(4):
        q.push(Waiter("a", 1, 1, tokens=100))
    for _ in range(2):
        q.push(Waiter("b", 1, 1, tokens=200))
    # b's requests cost twice a's: a gets two for each of b's (ties go to the older head).
    assert drain(q) == ["a", "b", "a", "a", "b", "a"]
    assert q.counters == {"a": 400.0, "b": 400.0}


def test_weights_share_tokens_in_proportion() -> None:
    q = FairQueue(3)
    for _ in range(9):
        q.push(Waiter("heavy", 1, 1, tokens=10, weight=3.0))
        q.push(Waiter("light", 1, 1, tokens=10, weight=1.0))
    order = drain(q)[:8]
    assert order.count("heavy") == 6 and order.count("light") == 2  # 3:1 while both are backlogged
    assert q.counters["light"] == 90.0 and q.counters["heavy"] == pytest.approx(30.0)


def test_strict_priority_between_classes_fair_within() -> None:
    q = FairQueue(3)
    q.push(Waiter("a", 2, 1, 10))  # batch, first to arrive
    q.push(Waiter("a", 1, 1, 10))
    q.push(Waiter("b", 1, 1, 10))
    q.push(Waiter("c", 0, 1, 10))  # interactive, last to arrive
    assert drain(q) == ["c", "b", "a", "a"]  # in class 1, b (less queued) wins the tie with a


def test_a_newly_backlogged_tenant_banks_no_credit() -> None:
    q = FairQueue(3)
    for _ in range(3):
        q.push(Waiter("flood", 1, 1, 100))
    drain(q)  # flood's counter is 300, the floor (last admission's counter) 200
    q.push(Waiter("flood", 1, 1, 100))
    q.push(Waiter("quiet", 1, 1, 100))  # idle until now: lifted to the smallest backlogged counter, 300
    assert q.counters["quiet"] == 300.0
    assert drain(q) == ["flood", "quiet"]


def test_an_idle_tenant_is_lifted_to_the_floor_when_nobody_waits() -> None:
    q = FairQueue(3)
    for _ in range(5):
        q.push(Waiter("a", 1, 1, 10))
        drain(q)
    q.push(Waiter("b", 1, 1, 10))
    assert q.counters["b"] == q.floor == 40.0


def test_settlement_charges_the_difference_to_the_expected_answer() -> None:
    q = FairQueue(3)
    q.charge("a", 500)
    q.charge("a", -200, weight=2.0)  # answered 400 tokens fewer than charged, at weight 2
    assert q.counters["a"] == 400.0


def test_a_full_queue_pushes_out_the_newest_waiter_of_the_tenant_furthest_over_its_share() -> None:
    q = FairQueue(3)
    flood = [Waiter("flood", 1, 1, 10) for _ in range(4)]
    for w in flood:
        q.push(w)
    newcomer = Waiter("quiet", 1, 1, 10)
    assert q.victim(newcomer) is flood[-1]
    # The flood's own next request is not let in at the expense of its older ones.
    assert q.victim(Waiter("flood", 1, 1, 10)) is None


def test_a_more_urgent_class_pushes_out_the_least_urgent_one_first() -> None:
    q = FairQueue(3)
    std, batch1, batch2 = Waiter("a", 1, 1, 10), Waiter("b", 2, 1, 10), Waiter("b", 2, 1, 10)
    for w in (std, batch1, batch2):
        q.push(w)
    assert q.victim(Waiter("c", 0, 1, 10)) is batch2
    assert q.victim(Waiter("c", 2, 1, 10)) is batch2  # in its own class: b holds two places, c none
    assert q.victim(Waiter("b", 2, 1, 10)) is None  # nor does b's own next one push out its older ones


def test_fcfs_mode_is_arrival_order_within_a_class() -> None:
    q = FairQueue(3, fair=False)
    for t in ("a", "a", "a", "b", "a", "b"):
        q.push(Waiter(t, 1, 1, 100))
    assert drain(q) == ["a", "a", "a", "b", "a", "b"]
    assert q.victim(Waiter("b", 1, 1, 10)) is None  # one tenant: nobody is over a share


def test_ahead_counts_more_urgent_classes_and_cheaper_tenants() -> None:
    q = FairQueue(3)
    q.push(Waiter("a", 0, 2, 10))
    for _ in range(3):
        q.push(Waiter("b", 1, 1, 10))
    q.charge("b", 1000)
    assert q.ahead(1, "c") == 2  # c would be lifted to the smallest backlogged counter (a's, 0): b, at 1000, is behind
    assert q.ahead(2, "c") == 5


def test_removing_keeps_the_counts_right() -> None:
    q = FairQueue(3)
    w1, w2 = Waiter("a", 1, 2, 10), Waiter("a", 2, 3, 10)
    q.push(w1)
    q.push(w2)
    assert q.cost == 5 and len(q) == 2 and q.waiting("a")
    assert q.remove(w1) and not q.remove(w1)
    assert q.cost == 3 and q.waiting("a")
    q.remove(w2)
    assert q.cost == 0 and not q.waiting("a") and q.peek() is None
