"""Bounded admission: at most `max_running` engine requests running per model, `max_queued` waiting.

Both limits follow the model's capacity (gateway.llm.capacity) unless given explicitly:
`set_capacity` changes them live. Raising the running limit admits waiters at once; lowering it
cancels nothing (running requests finish, new ones wait or are refused). The decisions are
synchronous (`try_admit`); waiting is a thin async layer over them.

Who waits and who goes next is gateway.llm.admission.fair's: strict priority between classes,
weighted fair queuing by tokens between tenants within one. A request that finds the queue full
pushes out a waiter further over its share, or is refused at once (503 + Retry-After) instead of
waiting without bound. A request with a TTFT deadline leaves the queue when the deadline passes
(ErrorKind.DEADLINE); gateway.llm.admission.deadlines refuses it before it queues when the
predicted wait already passes it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from engines.errors import ErrorKind, SluiceError
from gateway.llm.admission.fair import FairQueue, Waiter
from gateway.llm.admission.headroom import Headroom
from gateway.llm.admission.policy import DEFAULT_CLAIM, PRIORITIES, Claim
from gateway.llm.capacity import DEFAULT_WORKER_CAPACITY, derived_limits

DEFAULT_ANSWER_TOKENS = 256  # the expected answer before any answer of the model ended
_EWMA = 0.1  # weight of the newest answer length and hold time in their running means
# (event, claim, value): "admitted" (queue seconds), "refused:<reason>", "served" (tokens), "deadline:<met|missed>"
Observer = Callable[[str, Claim, float], None]


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Explicit limits per model (None: derived from the model's capacity), and the queue's order
    (`fair`: fair queuing across tenants; False: first come, first served within a class)."""

    max_running: int | None = None
    max_queued: int | None = None
    fair: bool = True

    def __post_init__(self) -> None:
        if self.max_running is not None and self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")
        if self.max_queued is not None and self.max_queued < 0:
            raise ValueError(f"max_queued must be >= 0, got {self.max_queued}")

    def limits(self, capacity: int) -> tuple[int, int]:
        return derived_limits(capacity, self.max_running, self.max_queued)


class _Mean:
    """A running mean: exact over the first 1/_EWMA values, then exponentially weighted."""

    __slots__ = ("count", "value")

    def __init__(self) -> None:
        self.value, self.count = 0.0, 0

    def add(self, x: float) -> None:
        self.count += 1
        self.value += (x - self.value) * max(_EWMA, 1.0 / self.count)


class QueueFull(SluiceError):
    def __init__(self, running: int, queued: int, *, evicted: bool = False) -> None:
        why = "a request with a better claim to the queue took its place" if evicted else \
            f"{running} requests running and {queued} queued"
        super().__init__(f"The server is overloaded ({why}); retry later.", ErrorKind.OVERLOADED, code="queue_full",
                         retry_after_s=1.0)


def deadline_error(message: str, retry_after_s: float, code: str) -> SluiceError:
    return SluiceError(message, ErrorKind.DEADLINE, code=code, retry_after_s=max(1.0, round(retry_after_s)))


class Ticket(Waiter):
    """One API request holding (or waiting for) `cost` engine slots. `release()` is idempotent."""

    __slots__ = (
        "_c",
        "_done",
        "_event",
        "_timed",
        "_timer",
        "admitted",
        "admitted_at",
        "claim",
        "created",
        "error",
        "prompt_tokens",
    )

    def __init__(self, controller: Admission, claim: Claim, cost: int, tokens: float, prompt_tokens: int) -> None:
        super().__init__(claim.tenant, claim.klass, cost, tokens, claim.weight)
        self._c = controller
        self.claim = claim
        self.admitted = False
        self.prompt_tokens = prompt_tokens
        self.error: SluiceError | None = None  # why it left the queue without running
        self.created = time.monotonic()
        self.admitted_at = 0.0
        # Only a waiting ticket needs an event (860 B): an admitted stream holds none.
        self._event: asyncio.Event | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._done = False
        self._timed = False  # its first token was timed against the deadline

    @property
    def deadline(self) -> float | None:
        """The monotonic time its first token is due by (None: no deadline)."""
        return None if self.claim.deadline_s is None else self.created + self.claim.deadline_s

    async def wait(self) -> None:
        """Until admitted, or until it left the queue without running (then `error` says why)."""
        if self._event is not None:
            await self._event.wait()

    def first_token(self) -> None:
        """The first token reached the client: count the deadline met or missed (once)."""
        if not self._timed and self.claim.deadline_s is not None:
            self._timed = True
            late = time.monotonic() - self.created - self.claim.deadline_s
            self._c.observe("deadline:missed" if late > 0 else "deadline:met", self.claim, max(late, 0.0))

    def release(self, completion_tokens: int | None = None) -> None:
        if self._done:
            return
        self._done = True
        self._c._release(self, completion_tokens)


class Admission:
    """Counts engine requests, not API requests: one request with n=8 takes 8 slots.

    Not thread-safe: use from one event loop."""

    def __init__(self, config: AdmissionConfig, capacity: int = DEFAULT_WORKER_CAPACITY) -> None:
        self.config = config
        self.capacity = capacity
        self.max_running, self.max_queued = config.limits(capacity)
        self.running = 0  # engine requests admitted
        self.queue = FairQueue(len(PRIORITIES), fair=config.fair)
        self.headroom = Headroom(len(PRIORITIES))  # slots kept for the more urgent classes
        self.hold_s: float | None = None  # running mean of how long an admitted request holds its slots
        # Running means of the answers' tokens: per tenant, and of all (a new tenant's expectation).
        self.answers: dict[str, _Mean] = {}
        self.all_answers = _Mean()
        self.observer: Observer | None = None

    @property
    def queued(self) -> int:
        return self.queue.cost

    def observe(self, event: str, claim: Claim, value: float = 0.0) -> None:
        if self.observer is not None:
            self.observer(event, claim, value)

    def set_capacity(self, capacity: int) -> bool:
        """Follow the model's capacity (live); True when a limit changed. Waiters that now fit run."""
        self.capacity = capacity
        limits = self.config.limits(capacity)
        if limits == (self.max_running, self.max_queued):
            return False
        self.max_running, self.max_queued = limits
        self._pump()
        return True

    def expected_answer(self, tenant: str, max_tokens: int) -> float:
        """The tokens an answer of `tenant` is expected to take: its recent mean, capped by `max_tokens`."""
        mean = self.answers.get(self.queue.key(tenant)) or self.all_answers
        return min(float(max_tokens), mean.value if mean.count else DEFAULT_ANSWER_TOKENS)

    def predicted_wait_s(self, claim: Claim, cost: int = 1) -> float:
        """About how long a request of `claim` would wait for its slots: the slots queued ahead of it
        (gateway.llm.admission.fair.ahead) turn over at `max_running` per mean hold time."""
        need = self.running + self.queue.ahead(claim.klass, claim.tenant) + min(cost, self.max_running) \
            - self._limit(claim.klass)
        if need <= 0 or self.hold_s is None:
            return 0.0
        return need / self.max_running * self.hold_s

    def try_admit(self, cost: int = 1, claim: Claim = DEFAULT_CLAIM, *, tokens: float = 0.0,
                  prompt_tokens: int = 0) -> Ticket:
        """Take `cost` slots, or a place in the queue; raise QueueFull if neither is free. `tokens` is the
        request's charge (prompt plus expected answer), `prompt_tokens` what its settlement counts from."""
        # A request wider than the whole model takes all of it when it runs, and never deadlocks.
        t = Ticket(self, claim, max(1, min(cost, self.max_running)), tokens, prompt_tokens)
        if self.running + t.cost <= self._limit(claim.klass) and not self.queue.busy(claim.klass):
            self._admit(t)
            return t
        if self.queued + t.cost > self.max_queued:
            victim = self.queue.victim(t)
            if victim is None or self.queued - victim.cost + t.cost > self.max_queued:
                self.observe("refused:queue_full", claim)
                raise QueueFull(self.running, self.queued)
            assert isinstance(victim, Ticket)
            self._leave(victim, QueueFull(self.running, self.queued, evicted=True), "evicted")
        t._event = asyncio.Event()
        self.queue.push(t)
        self.headroom.wait(t.klass, t.cost)
        if t.deadline is not None:
            t._timer = asyncio.get_running_loop().call_later(max(0.0, t.deadline - time.monotonic()), self._expire, t)
        return t

    def _limit(self, klass: int) -> int:
        """The running total up to which a request of `klass` is admitted: the slots, less those kept free
        for the more urgent classes (gateway.llm.admission.headroom)."""
        return self.max_running - self.headroom.reserved(klass, self.max_running)

    def _unqueue(self, t: Waiter) -> bool:
        if not self.queue.remove(t):
            return False
        self.headroom.wait(t.klass, -t.cost)
        return True

    def _admit(self, t: Ticket) -> None:
        t.admitted = True
        t.admitted_at = time.monotonic()
        self.running += t.cost
        self.headroom.add(t.klass, t.cost)
        self.queue.admitted(t)
        if t._timer is not None:
            t._timer.cancel()
            t._timer = None
        self.observe("admitted", t.claim, t.admitted_at - t.created)
        if t._event is not None:
            t._event.set()

    def _leave(self, t: Ticket, error: SluiceError, reason: str) -> None:
        """`t` leaves the queue without running: its waiter raises `error`."""
        if not self._unqueue(t):
            return
        if t._timer is not None:
            t._timer.cancel()
        t.error = error
        t._done = True
        self.observe(f"refused:{reason}", t.claim)
        if t._event is not None:
            t._event.set()

    def _expire(self, t: Ticket) -> None:
        t._timer = None
        if not t.admitted:
            self._leave(t, deadline_error(f"The request's time-to-first-token deadline of {t.claim.deadline_s:g} s "
                                          "passed while it waited for admission; retry later.",
                                          self.predicted_wait_s(t.claim, t.cost), "deadline_exceeded"),
                        "deadline_expired")
            self._pump()

    def _release(self, t: Ticket, completion_tokens: int | None) -> None:
        if t.admitted:
            self.running -= t.cost
            self.headroom.remove(t.klass, t.cost)
            self._settle(t, completion_tokens)
        else:
            if t._timer is not None:
                t._timer.cancel()
            self._unqueue(t)
        self._pump()

    def _settle(self, t: Ticket, completion_tokens: int | None) -> None:
        """Charge the tenant what it was really served; learn its answers' length and the hold time."""
        held = time.monotonic() - t.admitted_at
        self.hold_s = held if self.hold_s is None else (1 - _EWMA) * self.hold_s + _EWMA * held
        if completion_tokens is None:
            return
        served = t.prompt_tokens + completion_tokens
        self.queue.charge(t.tenant, served - t.tokens, t.weight)
        key = self.queue.key(t.tenant)
        answer = completion_tokens / t.cost
        self.answers.setdefault(key, _Mean()).add(answer)
        self.all_answers.add(answer)
        self.observe("served", t.claim, served)

    def _pump(self) -> None:
        # A waiter wider than a lowered limit is admitted once nothing else runs (never deadlocks).
        while (nxt := self.queue.peek()) is not None and \
                (self.running + nxt.cost <= self._limit(nxt.klass) or self.running == 0):
            self._unqueue(nxt)
            assert isinstance(nxt, Ticket)
            self._admit(nxt)
