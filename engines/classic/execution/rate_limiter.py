"""Triton's rate limiter: an instance executes only once it holds the resources its instance group's
`rate_limiter` names, and instances waiting for the same resources take turns by priority.

A config asks, per instance group:

    instance_group [ { count: 2, kind: KIND_CPU,
                       rate_limiter { resources [ { name: "cpu", count: 1 } ], priority: 2 } } ]

and `sluice serve --rate-limit execution_count` turns the limiter on (off by default, as in Triton),
with `--rate-limit-resource cpu:2` for what the server has of a resource; a resource no flag names
has the largest count any loaded instance asks for (Triton's default), so one instance can always
run. Requirements larger than the server's supply are refused when the model loads.

Turns: every model version keeps a virtual time that a grant advances by its priority (0 counts as
1), so a model of priority 2 is granted half as often as one of priority 1 while both wait (Triton's
wording: "1/2 the number of scheduling chances"). Triton counts turns per instance; here they are
counted per model version, whichever of its instances runs (its dynamic batcher is one line), so a
model with more instances gets more concurrency when resources allow, not more turns. A model
that has been idle starts from the virtual time of the latest grant, not from its own old one, so it
cannot take a run of turns on waking. A grant goes to the earliest waiter; a later one that shares a
resource with it waits behind it even when what it needs is free, so the resources drain to a model
that needs more than the others (many small ones cannot starve it); models with no resource in
common do not wait for each other. Everything runs on the event loop: no locks.

The driver of a model version (engines/classic/scheduling/scheduler.py) asks before forming a
batch (`acquire`), gives back what it did not use (`release`), is woken by `wake` when a turn may be
its own, and leaves the line when it has nothing due (`withdraw`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from engines.classic.errors import ConfigError


@dataclass(frozen=True)
class Requirement:
    """What one execution of an instance holds, and its priority (1 or more: a weight)."""

    resources: tuple[tuple[str, int], ...]
    priority: int = 1

    @classmethod
    def of_group(cls, group: Any, source: str) -> Requirement | None:
        """The `rate_limiter` of an instance group (a ModelInstanceGroup), or None without one."""
        if not group.HasField("rate_limiter"):
            return None
        limiter = group.rate_limiter
        resources: dict[str, int] = {}
        for i, r in enumerate(limiter.resources):
            if not r.name or r.count < 0:
                raise ConfigError(f"{source}: instance_group rate_limiter resources[{i}] needs a name and a "
                                  f"count >= 0, got name {r.name!r} count {r.count}")
            resources[r.name] = resources.get(r.name, 0) + r.count
        return cls(tuple(sorted(resources.items())), max(1, limiter.priority))


@dataclass
class _Waiter:
    requirement: Requirement
    wake: Callable[[], None]


@dataclass
class RateLimiter:
    """One per server process (ModelRepositoryManager). `supply` is what `--rate-limit-resource` set."""

    supply: dict[str, int] = field(default_factory=dict)
    grants: int = 0
    _clock: float = 0.0  # the virtual time of the latest grant, where a version back from idle starts
    _models: dict[Hashable, list[Requirement]] = field(default_factory=dict)  # each loaded version's needs
    _held: dict[str, int] = field(default_factory=dict)  # by running executions
    _vtime: dict[Hashable, float] = field(default_factory=dict)  # per model version
    _waiting: dict[Hashable, _Waiter] = field(default_factory=dict)  # per model version
    _idle: set[Hashable] = field(default_factory=set)  # versions that left the line with nothing due

    def register(self, model: Hashable, needs: list[Requirement], source: str) -> None:
        """A model version whose instances will ask for `needs`; raises ConfigError when the supply
        cannot meet one."""
        for requirement in needs:
            for name, count in requirement.resources:
                if name in self.supply and count > self.supply[name]:
                    raise ConfigError(f"{source}: an instance asks for {count} of rate-limiter resource "
                                      f"'{name}', but --rate-limit-resource gives {self.supply[name]}")
        self._models[model] = needs

    def unregister(self, model: Hashable) -> None:
        self._models.pop(model, None)
        self.withdraw(model)
        self._vtime.pop(model, None)
        self._idle.discard(model)

    def capacity(self, name: str) -> int:
        """The server's count of a resource: the flag's, else the most any loaded instance asks for."""
        if name in self.supply:
            return self.supply[name]
        return max((c for needs in self._models.values() for r in needs for n, c in r.resources if n == name),
                   default=0)

    def _fits(self, requirement: Requirement) -> bool:
        return all(self.capacity(name) - self._held.get(name, 0) >= count for name, count in requirement.resources)

    def acquire(self, key: Hashable, requirement: Requirement, wake: Callable[[], None]) -> bool:
        """Take the resources of one execution of model version `key` now (True), or join the line
        (False: `wake` is called when a turn may be `key`'s; ask again then)."""
        if key in self._idle or key not in self._vtime:  # back from idle: no run of saved-up turns
            self._idle.discard(key)
            self._vtime[key] = max(self._vtime.get(key, 0.0), self._clock)
        mine = self._vtime.get(key, 0.0)
        # An earlier waiter for any of the same resources goes first, even one that does not fit yet:
        # the resources drain to it, so a model needing more than the others is not starved by them.
        wanted = {name for name, _ in requirement.resources}
        ahead = any(self._vtime.get(k, 0.0) < mine and wanted & {name for name, _ in w.requirement.resources}
                    for k, w in self._waiting.items() if k != key)
        if ahead or not self._fits(requirement):
            self._waiting[key] = _Waiter(requirement, wake)
            return False
        self._waiting.pop(key, None)
        self._clock = max(self._clock, mine)  # the virtual time of the latest grant
        for name, count in requirement.resources:
            self._held[name] = self._held.get(name, 0) + count
        if self._waiting:  # what is left may still fit a waiter that yielded to this one
            self._wake_fitting()
        return True

    def charge(self, key: Hashable, requirement: Requirement) -> None:
        """Model version `key` used its grant: its turn is taken (its virtual time advances by its priority)."""
        self._vtime[key] = self._vtime.get(key, 0.0) + requirement.priority
        self.grants += 1

    def release(self, requirement: Requirement) -> None:
        """Give back what one execution held and wake the waiters that may now run, earliest first."""
        for name, count in requirement.resources:
            self._held[name] -= count
        self._wake_fitting()

    def withdraw(self, key: Hashable) -> None:
        """Model version `key` has nothing due: it leaves the line (a waiter behind it may now run)."""
        self._idle.add(key)
        if self._waiting.pop(key, None) is not None:
            self._wake_fitting()

    def _wake_fitting(self) -> None:
        for _, waiter in sorted(((self._vtime.get(k, 0.0), w) for k, w in self._waiting.items()),
                                key=lambda pair: pair[0]):
            if self._fits(waiter.requirement):
                waiter.wake()

    def snapshot(self) -> dict[str, Any]:
        names = sorted({n for needs in self._models.values() for r in needs for n, _ in r.resources})
        return {"resources": {n: {"capacity": self.capacity(n), "held": self._held.get(n, 0)} for n in names},
                "waiting": len(self._waiting), "grants": self.grants}


def parse_resources(specs: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """`--rate-limit-resource NAME:COUNT` values; raises ValueError naming a bad one."""
    out: dict[str, int] = {}
    for spec in specs:
        name, _, count = spec.partition(":")
        if ":" in count:
            raise ValueError(f"rate-limit resource {spec!r}: a per-device count (NAME:COUNT:DEVICE) is for "
                             "GPUs; Sluice's classic instances run on the CPU")
        if not name or len(name) > 128 or not count.isdigit() or int(count) > 1_000_000:
            raise ValueError(f"rate-limit resource must be NAME:COUNT (COUNT 0 to 1000000), got {spec!r}")
        out[name] = int(count)
    return tuple(sorted(out.items()))


def requirements(config: Any, source: str) -> list[Requirement | None]:
    """Each instance's requirement, in instance order (groups expanded as the pool builds them)."""
    groups: Iterable[Any] = config.instance_group
    out: list[Requirement | None] = []
    for group in groups:
        out += [Requirement.of_group(group, source)] * max(1, group.count)
    return out or [None]
