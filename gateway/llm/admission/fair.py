"""Which waiting LLM request is admitted next: strict priority between classes, weighted fair
queuing by tokens between tenants within a class. Pure and synchronous (no clock, no I/O).

The reference is the Virtual Token Counter (VTC, Sheng et al., OSDI '24): every tenant has a
counter of the tokens it was served divided by its weight, and the backlogged tenant with the
smallest counter goes next. Two changes fit a gateway, which admits a request once and never
sees its engine's steps:

- **Charged at admission, settled at the end.** VTC counts output tokens as the engine makes
  them. Here a request is charged its prompt plus its *expected* output when it is admitted
  (the tenant's recent mean answer, capped by its `max_tokens`), and the difference to the real
  count when it ends (`settle`). A tenant whose answers are long is then charged for them before
  they decode, not after: with VTC a burst of long requests is admitted on the cheap counter it
  has while none of them has produced a token yet.
- **Fair dropping.** The queue is bounded. When it is full, an arriving request pushes out the
  newest waiter of the tenant furthest over its share (its counter plus what it has queued, per
  weight), when that is not the arriving tenant itself; a request of a more urgent class pushes
  out one of a less urgent class first. A flood fills the queue with its own requests and then
  loses them, instead of making every other tenant's requests bounce.

A tenant that becomes backlogged has its counter lifted to the smallest counter of the tenants
that are backlogged now (or, with none, to the counter of the last admission), so an idle
tenant banks no credit it could later spend in a burst (VTC's rule).

Weights come from the keys file (`weight:`); a tenant is a key's `tenant:` or its id. Without
keys there is one tenant, and the order is first come, first served within a class.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator


class Waiter:
    """What the queue needs of a waiting request (gateway.llm.admission.gate.Ticket extends it)."""

    __slots__ = ("cost", "klass", "seq", "tenant", "tokens", "weight")

    def __init__(self, tenant: str, klass: int, cost: int, tokens: float, weight: float = 1.0) -> None:
        self.tenant = tenant
        self.klass = klass  # priority class, 0 most urgent
        self.cost = cost  # engine slots it takes when it runs
        self.tokens = tokens  # its charge at admission: prompt plus expected output
        self.weight = weight
        self.seq = 0  # arrival order, set by the queue


class FairQueue:
    """Waiters by class and tenant, and each tenant's virtual token counter."""

    def __init__(self, classes: int, *, fair: bool = True) -> None:
        self.fair = fair  # False: one tenant (first come, first served within a class)
        self._classes: list[dict[str, deque[Waiter]]] = [{} for _ in range(classes)]
        self._queued_tokens: dict[str, float] = {}  # per tenant, over all classes
        self.counters: dict[str, float] = {}
        self.floor = 0.0  # the counter of the last admission
        self.cost = 0  # engine slots waiting
        self.weights: dict[str, float] = {}  # each tenant's, as its requests last said
        self._unsynced: dict[str, float] = {}  # tokens served here not yet shared (gateway.llm.admission.shared)
        self._seq = itertools.count(1)

    def __len__(self) -> int:
        return sum(len(q) for queues in self._classes for q in queues.values())

    def busy(self, klass: int) -> bool:
        """Whether anything waits in `klass` or a more urgent class."""
        return any(self._classes[:klass + 1])

    def key(self, tenant: str) -> str:
        return tenant if self.fair else ""

    def counter(self, tenant: str) -> float:
        return self.counters.get(self.key(tenant), self.floor)

    def waiting(self, tenant: str) -> bool:
        return self._queued_tokens.get(self.key(tenant)) is not None

    def push(self, w: Waiter) -> None:
        t = self.key(w.tenant)
        if t not in self._queued_tokens:  # newly backlogged: no banked credit
            self.counters[t] = self._lifted(t)
            self._queued_tokens[t] = 0.0
        w.seq = next(self._seq)
        self._classes[w.klass].setdefault(t, deque()).append(w)
        self._queued_tokens[t] += w.tokens
        self.cost += w.cost

    def remove(self, w: Waiter) -> bool:
        """Take `w` out of the queue (admitted, expired, evicted, or its client left)."""
        t = self.key(w.tenant)
        q = self._classes[w.klass].get(t)
        if q is None:
            return False
        try:
            q.remove(w)
        except ValueError:
            return False
        if not q:
            del self._classes[w.klass][t]
        self.cost -= w.cost
        left = self._queued_tokens[t] - w.tokens
        if any(t in queues for queues in self._classes):
            self._queued_tokens[t] = max(0.0, left)
        else:
            del self._queued_tokens[t]
        return True

    def peek(self) -> Waiter | None:
        """The next waiter to admit: the most urgent class; in it, the smallest counter (ties: the tenant with
        less queued, as a newcomer lifted to a flood's counter is; then the older head)."""
        for queues in self._classes:
            if queues:
                t = min(queues, key=lambda u: (self.counters.get(u, self.floor), self._queued_tokens[u],
                                               queues[u][0].seq))
                return queues[t][0]
        return None

    def charge(self, tenant: str, tokens: float, weight: float = 1.0, *, local: bool = True) -> None:
        """Count `tokens` served to `tenant` (negative: a settlement that gives some back); `local`: here,
        rather than by another replica (those are not shared again)."""
        t = self.key(tenant)
        self.counters[t] = self.counters.get(t, self.floor) + tokens / max(weight, 1e-9)
        self.weights[t] = weight
        if local:
            self._unsynced[t] = self._unsynced.get(t, 0.0) + tokens

    def take_unsynced(self) -> dict[str, float]:
        """The tokens served here since the last call, per tenant."""
        out, self._unsynced = self._unsynced, {}
        return out

    def give_back_unsynced(self, tokens: dict[str, float]) -> None:
        """Tokens `take_unsynced` returned that could not be shared: kept for the next round."""
        for t, n in tokens.items():
            self._unsynced[t] = self._unsynced.get(t, 0.0) + n

    def admitted(self, w: Waiter) -> None:
        """`w` runs now: the floor moves to its tenant's counter, which is charged `w.tokens`."""
        t = self.key(w.tenant)
        self.floor = max(self.floor, self.counters.get(t, self.floor))
        self.charge(w.tenant, w.tokens, w.weight)

    def victim(self, arriving: Waiter) -> Waiter | None:
        """Who leaves a full queue so that `arriving` can wait: the newest waiter of the least urgent
        class below its own, else of the tenant in its class furthest over its share (not itself)."""
        for klass in range(len(self._classes) - 1, arriving.klass - 1, -1):
            queues = self._classes[klass]
            if not queues:
                continue
            worst = max(queues, key=lambda u: (self._projected(u, queues[u][0].weight), -queues[u][-1].seq))
            if klass > arriving.klass:
                return queues[worst][-1]
            mine = self.key(arriving.tenant)
            if worst == mine:
                return None
            own = self._projected(mine, arriving.weight, arriving.tokens)
            return queues[worst][-1] if self._projected(worst, queues[worst][0].weight) > own else None
        return None

    def _lifted(self, t: str) -> float:
        """`t`'s counter as it would be if it became backlogged now."""
        backlogged = [self.counters.get(u, self.floor) for u in self._queued_tokens]
        lift = min(backlogged) if backlogged else self.floor
        return max(self.counters.get(t, lift), lift)

    def _projected(self, t: str, weight: float, extra: float = 0.0) -> float:
        queued = self._queued_tokens.get(t, 0.0) + extra
        return self.counters.get(t, self.floor) + queued / max(weight, 1e-9)

    def ahead(self, klass: int, tenant: str) -> int:
        """Engine slots a new request of `tenant` in `klass` would wait behind, about: every waiter of a
        more urgent class, and in its own class those of tenants whose counter is not above its own."""
        t = self.key(tenant)
        mine = self.counters.get(t, self.floor) if t in self._queued_tokens else self._lifted(t)
        slots = sum(w.cost for queues in self._classes[:klass] for q in queues.values() for w in q)
        for u, q in self._classes[klass].items():
            if u == t or self.counters.get(u, self.floor) <= mine:
                slots += sum(w.cost for w in q)
        return slots

    def tenants(self) -> Iterator[str]:
        return iter(self._queued_tokens)
