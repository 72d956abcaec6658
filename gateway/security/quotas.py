"""Per-key quotas for one gateway replica: requests per minute, tokens per minute, concurrency.

`QuotaService` enforces them in a shared store (`QuotaStore`) when there is one: Redis when
configured (shared by every replica, `RedisQuotaStore`), else, in a frontend of `--frontends N`,
the table the frontends share on their node (`NodeQuotaStore`); in process otherwise
(`LocalQuotas`). When the store cannot be used it logs once, counts
`sluice_quota_redis_fallbacks_total` (Redis) or `sluice_quota_node_fallbacks_total` (the
frontends' table), and enforces the same limits locally; a background task pings the store and
shares quotas again once it answers. While local, each process allows a key its full
limits, so N of them may let it use up to N times them (the direction it fails in: open, never
closed): while some key has limits and they are enforced locally,
`sluice_quota_local` is 1 and `/health` says so (`health_detail`). Requests never
wait on a store that is away: after the first failure they go local at once.

The protocol edges call `admit` / `finish` around each request; the LLM layer
and the embeddings route call `reserve_tokens` at admission and
`commit_tokens` (or `refund_tokens`) when the request ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from engines.errors import ErrorKind, SluiceError
from gateway.security.keys import Limits
from gateway.security.metrics import SecurityMetrics
from gateway.security.quota_buckets import KeyNotShared, LocalQuotas, QuotaStore, Refusal
from gateway.security.redis_store import STORE_ERRORS, RedisQuotaStore

log = logging.getLogger("sluice.quotas")
_WHAT = {"rpm": "requests per minute", "tpm": "tokens per minute", "concurrency": "concurrent requests"}


@dataclass(slots=True)
class Lease:
    """One admitted request; `QuotaService.finish` ends it (idempotent)."""

    key_id: str
    slot: str | None  # where its concurrency slot lives: "shared" (the store), "local", or None (no limit)
    lease_id: str
    held: bool  # counted in sluice_key_requests_in_flight
    done: bool = False


class QuotaService:
    """Runs on one event loop; `finish`, `refund_tokens` and `commit_tokens` never block."""

    def __init__(self, limits: dict[str, Limits], metrics: SecurityMetrics, store: QuotaStore | None = None,
                 *, retry_s: float = 1.0) -> None:
        self._limits = limits
        self.metrics = metrics
        self.store = store
        self.local = LocalQuotas()
        self.shared = store is not None  # a store configured and, as far as we know, usable
        self._redis = isinstance(store, RedisQuotaStore)
        self._fallbacks = metrics.redis_fallbacks if self._redis else metrics.node_fallbacks
        self._retry_s = retry_s
        self._leases: dict[str, Lease] = {}  # in the store, renewed while their requests run
        self._ids = itertools.count()
        self._replica = uuid.uuid4().hex[:12]
        self._tasks: set[asyncio.Task[None]] = set()
        self._maintainer: asyncio.Task[None] | None = None
        self._lost_event = asyncio.Event()  # wakes the maintainer to start probing at once
        # Each key's request counter and in-flight gauge: `labels()` costs more than the increment, and
        # keys are the configured ones (plus anonymous), so the cache is bounded.
        self._children: dict[str, tuple[Any, Any]] = {}
        self.limited = any(not lim.unlimited for lim in limits.values())  # some key has a quota
        self._set_shared(self.shared)

    def _set_shared(self, shared: bool) -> None:
        self.shared = shared
        self.metrics.redis_up.set(1 if shared and self._redis else 0)
        self.metrics.quota_local.set(1 if self.limited and not shared else 0)

    def health_detail(self) -> str | None:
        """What /health says about quotas: None when no key has one."""
        if not self.limited:
            return None
        if self.shared and self.store is not None:
            return f"shared through {self.store.label}"
        why = f"{self.store.label} is unreachable" if self.store is not None else "no --redis-url"
        return (f"per-replica ({why}): each gateway replica enforces every key's full limits, so N replicas "
                "may let a key use N times them")

    def _metrics_of(self, key_id: str) -> tuple[Any, Any]:
        children = self._children.get(key_id)
        if children is None:
            children = self._children[key_id] = (self.metrics.requests.labels(key_id),
                                                 self.metrics.in_flight.labels(key_id))
        return children

    def limits(self, key_id: str) -> Limits:
        return self._limits.get(key_id, Limits())

    # -- requests ------------------------------------------------------------------
    async def admit(self, key_id: str, *, count: bool = True, hold: bool = True) -> Lease:
        """Count one request (`count`) and hold a concurrency slot until `finish` (`hold`);
        raise SluiceError(RATE_LIMITED) with a Retry-After hint when a limit is spent."""
        limits = self.limits(key_id)
        lease_id = f"{self._replica}:{next(self._ids)}" if hold and limits.concurrency else ""
        slot: str | None = None
        if (count and limits.rpm) or lease_id:
            refusal, slot = await self._admit(key_id, limits, lease_id, count)
            if refusal is not None:
                raise self._refused(key_id, limits, refusal)
        requests, in_flight = self._metrics_of(key_id)
        if count:
            requests.inc()
        lease = Lease(key_id, slot if lease_id else None, lease_id, hold)
        if hold:
            in_flight.inc()
        if lease.slot == "shared":
            self._leases[lease_id] = lease
        return lease

    def finish(self, lease: Lease) -> None:
        if lease.done:
            return
        lease.done = True
        if lease.held:
            self._metrics_of(lease.key_id)[1].dec()
        if lease.slot == "local":
            self.local.release(lease.key_id)
        elif lease.slot == "shared":
            self._leases.pop(lease.lease_id, None)
            if self.shared and self.store is not None:  # else it expires there, or the next renew drops it
                self._spawn(self.store.release(lease.key_id, lease.lease_id))

    async def _admit(self, key_id: str, limits: Limits, lease_id: str, count: bool) -> tuple[Refusal | None, str]:
        if self.shared and self.store is not None:
            try:
                return await self.store.admit(key_id, limits, lease_id or None, count=count), "shared"
            except KeyNotShared:
                pass  # this key alone is enforced here
            except STORE_ERRORS as e:
                self._lost(e)
        return self.local.admit(key_id, limits, count=count, hold=bool(lease_id)), "local"

    # -- tokens --------------------------------------------------------------------
    async def reserve_tokens(self, key_id: str, tokens: int) -> None:
        """Admission: charge a request's prompt tokens, or raise RATE_LIMITED if they do not fit now."""
        limits = self.limits(key_id)
        if not limits.tpm or tokens <= 0:
            return
        if tokens > limits.tpm:
            self.metrics.rejections.labels(key_id, "tpm").inc()
            raise SluiceError(f"This request needs {tokens} tokens, more than key '{key_id}' may use in a minute "
                              f"({limits.tpm}).", ErrorKind.RATE_LIMITED, code="rate_limit_exceeded",
                              retry_after_s=60.0)
        refusal: Refusal | None = None
        if self.shared and self.store is not None:
            try:
                refusal = await self.store.reserve_tokens(key_id, limits.tpm, tokens)
                if refusal is not None:
                    raise self._refused(key_id, limits, refusal)
                return
            except KeyNotShared:
                pass
            except STORE_ERRORS as e:
                self._lost(e)
        refusal = self.local.reserve_tokens(key_id, limits.tpm, tokens)
        if refusal is not None:
            raise self._refused(key_id, limits, refusal)

    def refund_tokens(self, key_id: str, tokens: int) -> None:
        """Give back reserved prompt tokens of a request that never ran."""
        self._charge(key_id, -tokens)

    def commit_tokens(self, key_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        """A request ended: count its usage, and charge its completion tokens (they may overdraw
        the budget; later requests wait the debt out)."""
        self.metrics.tokens.labels(key_id, "prompt").inc(prompt_tokens)
        self.metrics.tokens.labels(key_id, "completion").inc(completion_tokens)
        self._charge(key_id, completion_tokens)

    def _charge(self, key_id: str, tokens: int) -> None:
        tpm = self.limits(key_id).tpm
        if not tpm or not tokens:
            return
        if self.shared and self.store is not None:
            self._spawn(self._charge_shared(self.store, key_id, tpm, tokens))
        else:
            self.local.charge_tokens(key_id, tpm, tokens)

    async def _charge_shared(self, store: QuotaStore, key_id: str, tpm: int, tokens: int) -> None:
        try:
            await store.charge_tokens(key_id, tpm, tokens)
        except KeyNotShared:
            self.local.charge_tokens(key_id, tpm, tokens)
        except STORE_ERRORS as e:
            self._lost(e)
            self.local.charge_tokens(key_id, tpm, tokens)

    # -- the store's availability ----------------------------------------------------
    def _refused(self, key_id: str, limits: Limits, refusal: Refusal) -> SluiceError:
        self.metrics.rejections.labels(key_id, refusal.reason).inc()
        wait_s = max(1, math.ceil(refusal.retry_after_s))
        return SluiceError(f"Rate limit reached for key '{key_id}': {getattr(limits, refusal.reason)} "
                           f"{_WHAT[refusal.reason]}. Retry in {wait_s} s.", ErrorKind.RATE_LIMITED,
                           code="rate_limit_exceeded", retry_after_s=float(wait_s))

    def _lost(self, error: BaseException) -> None:
        if not self.shared:
            return
        self._set_shared(False)
        self._fallbacks.inc()
        self._lost_event.set()
        log.warning("quotas: %s unreachable (%s: %s); enforcing quotas on this process alone until it returns",
                    self.store.label if self.store else "", type(error).__name__, error)

    def _back(self) -> None:
        self._set_shared(True)
        log.warning("quotas: %s is reachable again; quotas are shared again", self.store.label if self.store else "")

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(self._quietly(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _quietly(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except STORE_ERRORS as e:
            self._lost(e)

    async def flush(self) -> None:
        """Wait for the store writes `finish` and the token calls started (releases, charges)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def start(self) -> None:
        """Raise RedisAccessError when Redis refuses this gateway; a store that is away is only lost."""
        if self.store is not None and self._maintainer is None:
            await self._quietly(self.store.check())
            self._maintainer = asyncio.create_task(self._maintain(self.store), name="sluice-quota-redis")

    async def stop(self) -> None:
        task, self._maintainer = self._maintainer, None
        if task is not None:
            task.cancel()
        pending = [t for t in (task, *self._tasks) if t is not None]
        if pending:
            await asyncio.wait(pending, timeout=2.0)
        if self.store is not None:
            with contextlib.suppress(*STORE_ERRORS):
                await asyncio.wait_for(self.store.close(), timeout=2.0)

    def _live(self) -> list[tuple[str, str]]:
        return [(lease.key_id, lease.lease_id) for lease in self._leases.values()]

    async def _maintain(self, store: QuotaStore) -> None:
        """Renew this process's leases while their requests run; while the store is away, probe it."""
        renew_s = store.lease_ttl_ms / 3000
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._lost_event.wait(), renew_s if self.shared else self._retry_s)
            if self._lost_event.is_set():
                self._lost_event.clear()
                await asyncio.sleep(self._retry_s)
            try:
                if not self.shared:
                    await store.ping()
                    # What this process holds there may have changed while it was away (leases that
                    # ended then, or expired there): tell the store which are still live.
                    await store.renew(self._live())
                    self._back()
                elif self._leases or store.renews_idle:
                    await store.renew(self._live())
                else:
                    await store.ping()
            except STORE_ERRORS as e:
                self._lost(e)
            except Exception:
                log.exception("quotas: maintenance step failed; retrying")
