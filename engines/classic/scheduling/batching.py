"""Pure batch-forming and queue-policy logic of the dynamic batcher (no I/O, no asyncio).

`BatchQueue` holds pending entries in priority levels (1 is the highest) and
answers two questions for its async driver:

- `expire(now_ns)`: which entries timed out (REJECT policy) and must be failed,
  even while every model instance is busy;
- `form_batch(now_ns)`: which entries to execute next, or how long to wait for
  a better batch.

Times are monotonic nanoseconds supplied by the caller, so tests drive the clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from engines.classic.proto import QUEUE_POLICY_REJECT, ModelConfig, ModelQueuePolicy


class QueueFull(Exception):
    """The request's priority level is at max_queue_size (Triton answers UNAVAILABLE)."""


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    max_queue_size: int = 0  # 0: unbounded
    default_timeout_us: int = 0  # 0: no timeout
    allow_timeout_override: bool = False  # may a request set a longer timeout than the default
    reject_on_timeout: bool = True  # REJECT; DELAY keeps the entry (never rejected here)

    def __post_init__(self) -> None:
        if self.max_queue_size < 0 or self.default_timeout_us < 0:
            raise ValueError("max_queue_size and default_timeout_us must be >= 0")

    @classmethod
    def from_proto(cls, policy: ModelQueuePolicy, default_max_queue_size: int = 0) -> QueuePolicy:
        return cls(
            max_queue_size=policy.max_queue_size or default_max_queue_size,
            default_timeout_us=policy.default_timeout_microseconds,
            allow_timeout_override=policy.allow_timeout_override,
            reject_on_timeout=policy.timeout_action == QUEUE_POLICY_REJECT,
        )

    def timeout_us(self, requested_us: int) -> int:
        """Effective timeout: a request may shorten the default, or replace it when allowed/none set."""
        if requested_us <= 0:
            return self.default_timeout_us
        if self.default_timeout_us == 0 or self.allow_timeout_override:
            return requested_us
        return min(requested_us, self.default_timeout_us)


@dataclass(frozen=True, slots=True)
class BatcherConfig:
    max_batch_size: int  # 0: the model does not batch; one request per execution
    dynamic: bool = False  # dynamic_batching present in the config
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    priority_levels: int = 1
    default_priority_level: int = 1
    default_policy: QueuePolicy = QueuePolicy()
    level_policies: Mapping[int, QueuePolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_batch_size < 0:
            raise ValueError(f"max_batch_size must be >= 0, got {self.max_batch_size}")
        if self.priority_levels < 1 or not 1 <= self.default_priority_level <= self.priority_levels:
            raise ValueError("default_priority_level must be in [1, priority_levels]")

    @classmethod
    def from_model_config(cls, config: ModelConfig, default_max_queue_size: int = 0) -> BatcherConfig:
        """The batcher of `config`; a queue policy without max_queue_size gets `default_max_queue_size`."""
        if not config.HasField("dynamic_batching"):
            return cls(max_batch_size=config.max_batch_size,
                       default_policy=QueuePolicy(max_queue_size=default_max_queue_size))
        db = config.dynamic_batching
        levels = max(1, db.priority_levels)
        return cls(
            max_batch_size=config.max_batch_size,
            dynamic=config.max_batch_size > 0,
            preferred_batch_sizes=tuple(sorted(db.preferred_batch_size)),
            max_queue_delay_us=db.max_queue_delay_microseconds,
            priority_levels=levels,
            default_priority_level=db.default_priority_level or (levels + 1) // 2 if db.priority_levels else 1,
            default_policy=QueuePolicy.from_proto(db.default_queue_policy, default_max_queue_size),
            level_policies={int(k): QueuePolicy.from_proto(v, default_max_queue_size)
                            for k, v in db.priority_queue_policy.items()},
        )

    def policy(self, level: int) -> QueuePolicy:
        return self.level_policies.get(level, self.default_policy)


@dataclass(slots=True)
class Entry:
    item: Any  # opaque to this module (the driver's pending request)
    batch_size: int  # rows this request contributes (dim 0, or 1 for non-batching models)
    key: Hashable  # requests batch together only when keys are equal (same non-batch shapes)
    level: int
    enqueue_ns: int
    deadline_ns: int | None  # None: never times out


@dataclass(frozen=True, slots=True)
class BatchDecision:
    entries: list[Entry]  # empty: nothing to run now
    wait_until_ns: int | None  # when to ask again if entries is empty (None: wait for new work)


class BatchQueue:
    """Priority queues plus the batching decision. Not thread-safe; one driver owns it.

    Every operation on the hot path (`push`, `form_batch`, and `expire` / `next_deadline_ns`
    while no entry has a deadline) costs time in the batch it returns, not in the queue's length.
    """

    def __init__(self, config: BatcherConfig) -> None:
        self.config = config
        self._levels: dict[int, deque[Entry]] = {lvl: deque() for lvl in range(1, config.priority_levels + 1)}
        self._order = [self._levels[lvl] for lvl in sorted(self._levels)]  # highest priority first
        self._count = 0
        self._timed = 0  # entries with a deadline: while 0, nothing can expire

    def __len__(self) -> int:
        return self._count

    def level_for(self, priority: int) -> int:
        """Triton: priority 0 or outside [1, priority_levels] means the default level."""
        if 1 <= priority <= self.config.priority_levels:
            return priority
        return self.config.default_priority_level

    def push(self, item: Any, batch_size: int, key: Hashable, priority: int, timeout_us: int, now_ns: int) -> Entry:
        """Enqueue; raises QueueFull when the level's max_queue_size is reached."""
        level = self.level_for(priority)
        policy = self.config.policy(level)
        queue = self._levels[level]
        if policy.max_queue_size and len(queue) >= policy.max_queue_size:
            raise QueueFull("Exceeds maximum queue size")
        timeout = policy.timeout_us(timeout_us)
        deadline = now_ns + timeout * 1000 if timeout and policy.reject_on_timeout else None
        entry = Entry(item, batch_size, key, level, now_ns, deadline)
        queue.append(entry)
        self._count += 1
        self._timed += deadline is not None
        return entry

    def remove(self, predicate: Any) -> list[Entry]:
        """Drop entries for which predicate(entry) is true (e.g. cancelled by the client)."""
        dropped: list[Entry] = []
        for lvl, queue in self._levels.items():
            keep: deque[Entry] = deque()
            for e in queue:
                (dropped if predicate(e) else keep).append(e)
            if len(keep) != len(queue):
                self._levels[lvl] = keep
        if dropped:
            self._order = [self._levels[lvl] for lvl in sorted(self._levels)]
            self._count -= len(dropped)
            self._timed -= sum(e.deadline_ns is not None for e in dropped)
        return dropped

    def expire(self, now_ns: int) -> list[Entry]:
        """Remove and return the entries whose deadline has passed."""
        if not self._timed:
            return []
        return self.remove(lambda e: e.deadline_ns is not None and e.deadline_ns <= now_ns)

    def next_deadline_ns(self) -> int | None:
        if not self._timed:
            return None
        deadlines = [e.deadline_ns for q in self._order for e in q if e.deadline_ns is not None]
        return min(deadlines, default=None)

    def _ordered(self) -> Iterator[Entry]:
        for queue in self._order:
            yield from queue

    def form_batch(self, now_ns: int) -> BatchDecision:
        """Pick the next batch (removing it from the queue), or say when to look again."""
        if not self._count:
            return BatchDecision([], None)
        cfg = self.config
        if not cfg.dynamic:
            return self._take(1)
        chosen, blocked = _gather(self._ordered(), cfg.max_batch_size)
        total = sum(e.batch_size for e in chosen)
        oldest_ns = min(e.enqueue_ns for e in chosen)
        delay_over = now_ns - oldest_ns >= cfg.max_queue_delay_us * 1000
        if cfg.preferred_batch_sizes:
            best = max(cfg.preferred_batch_sizes)
            if total >= best:
                return self._take(len(_trim(chosen, best)))
            if total in cfg.preferred_batch_sizes and blocked:
                return self._take(len(chosen))
        if total >= cfg.max_batch_size or blocked or delay_over:
            return self._take(len(chosen))
        return BatchDecision([], oldest_ns + cfg.max_queue_delay_us * 1000)

    def _take(self, count: int) -> BatchDecision:
        """Remove the first `count` entries in priority/FIFO order: every batch is such a prefix."""
        taken: list[Entry] = []
        for queue in self._order:
            while queue and len(taken) < count:
                taken.append(queue.popleft())
            if len(taken) == count:
                break
        self._count -= len(taken)
        self._timed -= sum(e.deadline_ns is not None for e in taken)
        return BatchDecision(taken, None)


def _gather(ordered: Iterator[Entry], max_batch_size: int) -> tuple[list[Entry], bool]:
    """Take entries in priority/FIFO order while they fit and share the first one's key.

    Stops at the first entry that does not fit or differs in shape, rather than
    skipping ahead, so that requests are not reordered: the chosen entries are a prefix
    of the order. Returns (chosen, blocked) where blocked means the batch cannot grow any further.
    """
    first = next(ordered)
    chosen = [first]
    total = first.batch_size
    for entry in ordered:
        if entry.key != chosen[0].key or total + entry.batch_size > max_batch_size:
            return chosen, True
        chosen.append(entry)
        total += entry.batch_size
    return chosen, total >= max_batch_size


def _trim(chosen: list[Entry], limit: int) -> list[Entry]:
    out: list[Entry] = []
    total = 0
    for entry in chosen:
        if out and total + entry.batch_size > limit:
            break
        out.append(entry)
        total += entry.batch_size
    return out

