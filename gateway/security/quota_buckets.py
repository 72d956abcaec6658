"""Quota arithmetic and the in-process quota store. Pure: no I/O, no event loop.

Rates (requests and tokens per minute) are GCRA buckets, the algorithm behind
most production rate limiters: a bucket keeps one number, its theoretical
arrival time `tat`. Each unit of cost pushes it `60 s / limit` further; a cost is
refused when it would push `tat` more than one window (60 s) past now. So a key
may burst its whole per-minute budget at once and then spends at the steady
rate. Tokens a request has already used (its completion) are charged without a
check and may push `tat` further (debt), which later requests wait out.

Concurrency is a count of leases. `RedisQuotaStore` implements the same three
operations in Lua, atomically across replicas, and `NodeQuotaStore` on a table the
frontends of `--frontends N` share; this one serves a gateway without either, and any
gateway while its shared store is away. `QuotaStore` is what a shared store offers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

from gateway.security.keys import Limits

WINDOW_S = 60.0
CONCURRENCY_RETRY_S = 1.0  # a slot frees when a request ends; there is no schedule to point at


class Refusal(NamedTuple):
    reason: str  # "rpm", "tpm" or "concurrency": a metric label
    retry_after_s: float


class KeyNotShared(Exception):
    """The shared store cannot hold this key (the frontends' table is full): enforce it in this
    process; the store stays in use for every other key."""


class QuotaStore(Protocol):
    """Quotas shared by several processes (gateway.security.redis_store, gateway.security.node_quotas).
    Every call raises one of `STORE_ERRORS` (redis_store) when the store cannot be used now."""

    label: str  # what the logs and /health call it: "Redis", ...
    lease_ttl_ms: int  # a concurrency lease not renewed within this expires (renewed every third of it)
    renews_idle: bool  # `renew` is called with no leases too (it rewrites what this process holds)

    async def admit(self, key_id: str, limits: Limits, lease_id: str | None, *, count: bool) -> Refusal | None: ...
    async def release(self, key_id: str, lease_id: str) -> None: ...
    async def renew(self, leases: list[tuple[str, str]]) -> None: ...
    async def reserve_tokens(self, key_id: str, tpm: int, tokens: int) -> Refusal | None: ...
    async def charge_tokens(self, key_id: str, tpm: int, tokens: int) -> None: ...
    async def ping(self) -> None: ...
    async def check(self) -> None: ...
    async def close(self) -> None: ...


def charge(tat: float, now: float, cost: float, limit_per_window: int) -> float:
    """The bucket's tat after `cost` units (negative: a refund), never before now."""
    return max(max(tat, now) + cost * WINDOW_S / limit_per_window, now)


def check(tat: float, now: float, cost: float, limit_per_window: int) -> tuple[float | None, float]:
    """(new tat, 0) when the cost fits in the window, else (None, seconds until it would)."""
    new = charge(tat, now, cost, limit_per_window)
    excess = new - now - WINDOW_S
    return (None, excess) if excess > 0 else (new, 0.0)


class LocalQuotas:
    """Quotas of one process. Not thread-safe: use from one event loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tat: dict[tuple[str, str], float] = {}  # (key id, "rpm" | "tpm") -> tat
        self._slots: dict[str, int] = {}  # key id -> requests holding a slot

    def admit(self, key_id: str, limits: Limits, *, count: bool, hold: bool) -> Refusal | None:
        """Take a concurrency slot (`hold`) and a request unit (`count`), both or neither."""
        held = self._slots.get(key_id, 0)
        if hold and limits.concurrency and held >= limits.concurrency:
            return Refusal("concurrency", CONCURRENCY_RETRY_S)
        if count and limits.rpm:
            now = self._clock()
            new, wait = check(self._tat.get((key_id, "rpm"), now), now, 1, limits.rpm)
            if new is None:
                return Refusal("rpm", wait)
            self._tat[(key_id, "rpm")] = new
        if hold:
            self._slots[key_id] = held + 1
        return None

    def release(self, key_id: str) -> None:
        held = self._slots.get(key_id, 0)
        if held <= 1:
            self._slots.pop(key_id, None)
        else:
            self._slots[key_id] = held - 1

    def reserve_tokens(self, key_id: str, tpm: int, tokens: int) -> Refusal | None:
        now = self._clock()
        new, wait = check(self._tat.get((key_id, "tpm"), now), now, tokens, tpm)
        if new is None:
            return Refusal("tpm", wait)
        self._tat[(key_id, "tpm")] = new
        return None

    def charge_tokens(self, key_id: str, tpm: int, tokens: int) -> None:
        now = self._clock()
        self._tat[(key_id, "tpm")] = charge(self._tat.get((key_id, "tpm"), now), now, tokens, tpm)

    def in_use(self, key_id: str) -> int:
        return self._slots.get(key_id, 0)
