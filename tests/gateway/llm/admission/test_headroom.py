"""Trunk reservation for the more urgent classes, sized by their decaying recent peak."""

from __future__ import annotations

from gateway.llm.admission import Admission, AdmissionConfig, Claim
from gateway.llm.admission.headroom import HALF_LIFE_S, Headroom


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_nothing_is_reserved_while_one_class_is_in_use() -> None:
    h = Headroom(3, Clock())
    h.add(1, 10)
    assert h.reserved(1, 16) == 0 and h.reserved(0, 16) == 0
    assert h.reserved(2, 16) == 3  # a batch request leaves room for standard's peak x 1.25 (13), less what it runs
    h.remove(1, 10)
    assert h.reserved(2, 16) == 8  # standard ran 10 lately: 13 kept free, but at most half the slots


def test_the_reservation_follows_the_peak_and_decays() -> None:
    clock = Clock()
    h = Headroom(3, clock)
    h.add(0, 4)
    h.remove(0, 4)
    assert h.reserved(1, 100) == 5  # ceil(1.25 x 4)
    clock.now = HALF_LIFE_S
    assert h.reserved(1, 100) == 3  # the peak halved: ceil(1.25 x 2)
    clock.now = 20 * HALF_LIFE_S
    assert h.reserved(1, 100) == 0


async def test_interactive_requests_find_a_free_slot_beside_a_standard_flood() -> None:
    a = Admission(AdmissionConfig(max_running=8, max_queued=100))
    interactive = [a.try_admit(1, Claim("i", klass=0)) for _ in range(2)]
    for t in interactive:
        t.release(0)  # interactive demand seen: 2 at once
    flood = [a.try_admit(1, Claim("s")) for _ in range(20)]
    assert sum(t.admitted for t in flood) == 5  # 8 slots, 3 (ceil 1.25 x 2) kept for interactive
    urgent = a.try_admit(1, Claim("i", klass=0))
    assert urgent.admitted  # at once, without waiting for a standard request to end
    for t in [*flood, urgent]:
        t.release(0)


def test_waiting_counts_as_demand() -> None:
    h = Headroom(3, Clock())
    h.wait(0, 4)  # four interactive requests wait: the reservation covers them before any ran
    assert h.reserved(1, 100) == 5
    h.wait(0, -4)
    h.add(0, 4)
    assert h.reserved(1, 100) == 1  # now they run: 5 - 4
