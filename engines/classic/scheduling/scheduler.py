"""The async driver of one model version's dynamic batcher.

The pure decisions live in `batching.BatchQueue`, the instances in
`instances.InstancePool`; this module only moves requests between asyncio
futures, the queue and the instances:

- `submit()` enqueues (or raises OVERLOADED when the queue is full) and awaits
  the result; cancelling the awaiting task drops the request if not yet running.
- One driver task wakes on new work, on a freed instance, at the batcher's
  delay deadline and at the earliest queue timeout, so timed-out requests are
  rejected even while every instance is busy. It is an `engines.supervision.BackgroundTask`:
  if it dies, the requests it held fail with INTERNAL and it restarts (counted in `restarts`).
- With the rate limiter on (engines/classic/execution/rate_limiter.py), an instance's batch is formed
  only once the limiter grants the resources its instance group names; what it held is given back
  when the batch returns.
- Each batch runs on its instance's own thread (or on the loop, when the instance's gate
  finds it cheaper than the hop: engines/classic/execution/inline.py) and resolves every one of its
  requests, whatever the backend does.

Per request the loop does a push, one wake of the driver (a future, no task or
`wait_for`), and one callback when its batch returns; the driver's work per wake-up
is proportional to the batches it forms, not to the queue's length. Deadlines are
met to the microsecond without spinning (`timer.wake_at`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from engines.classic.errors import InferError, unavailable
from engines.classic.execution.instances import InstancePool, Outcome, Result, Slot
from engines.classic.execution.rate_limiter import RateLimiter, Requirement
from engines.classic.execution.threads import describe
from engines.classic.proto import ModelConfig
from engines.classic.request import InferRequest
from engines.classic.scheduling.batching import BatcherConfig, BatchQueue, QueueFull
from engines.classic.scheduling.timer import WakeHandle, wake_at
from engines.classic.stats import BACKEND, CANCELED, OTHER, REJECTED, ModelStats
from engines.errors import ErrorKind
from engines.supervision import QUICK_BACKOFF, BackgroundTask

# The driver re-checks its queue at least this often, whatever deadline a request carries.
_MAX_WAIT_NS = 60 * 1_000_000_000
# Unloading waits this long for running batches (a model without a time limit may never return);
# a batch still running then finishes on its own, and its instance is closed after it, on its thread.
_CLOSE_GRACE_S = 30.0


@dataclass(slots=True)
class _Pending:
    request: InferRequest
    future: asyncio.Future[dict[str, np.ndarray]]
    arrival_ns: int


class Scheduler:
    def __init__(self, config: ModelConfig, pool: InstancePool, stats: ModelStats,
                 default_max_queue_size: int = 0, limiter: RateLimiter | None = None,
                 needs: list[Requirement | None] | None = None, limit_key: Hashable = None) -> None:
        self._name = config.name
        self._limiter = limiter
        self._needs = needs or [None]  # per instance index: what the rate limiter must grant
        # This model version in the limiter's books (unique per load: a reload is a new version there).
        self._limit_key = limit_key
        self._queue = BatchQueue(BatcherConfig.from_model_config(config, default_max_queue_size))
        self._pool = pool
        self._stats = stats
        self._waiter: asyncio.Future[None] | None = None  # what the idle driver awaits
        self._woken = False  # work arrived since the driver last looked
        self._cancelled = False  # a queued request's client went away: drop it on the next pass
        pool.on_change = self._wake
        self._driver = BackgroundTask(f"scheduler of model '{self._name}'", self._drive, backoff=QUICK_BACKOFF,
                                      on_crash=self._crashed)
        self._batches: set[asyncio.Future[None]] = set()
        self._closed = False

    def start(self) -> None:
        self._driver.start()

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def restarts(self) -> int:
        """Times the driver died and was restarted."""
        return self._driver.restarts.total

    async def submit(self, request: InferRequest) -> dict[str, np.ndarray]:
        """Run one validated request; raises InferError (OVERLOADED for a full queue, UNAVAILABLE...)."""
        if self._closed:
            raise unavailable(f"model '{request.model}' is unloading")
        if not self._pool.usable:
            raise unavailable(f"model '{request.model}' has no usable instance: {self._pool.reason}")
        now_ns = time.monotonic_ns()
        self._stats.request_started()
        future: asyncio.Future[dict[str, np.ndarray]] = asyncio.get_running_loop().create_future()
        pending = _Pending(request, future, now_ns)
        try:
            self._queue.push(pending, request.batch_size, request.batch_key, request.priority,
                             request.timeout_us, now_ns)
        except QueueFull as exc:
            self._stats.request_done(False, time.monotonic_ns() - now_ns, reason=REJECTED)
            raise InferError(str(exc), ErrorKind.OVERLOADED) from None
        self._wake()
        try:
            return await future
        except asyncio.CancelledError:
            self._cancelled = True  # let the driver drop the cancelled entry and free its queue slot now
            self._wake()
            raise

    def _wake(self) -> None:
        self._woken = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _drive(self) -> None:
        while True:
            self._woken = False
            now_ns = time.monotonic_ns()
            for entry in self._queue.expire(now_ns):
                self._finish(entry.item, unavailable("Request timeout expired"), None, REJECTED)
            if self._cancelled:
                self._cancelled = False
                for entry in self._queue.remove(lambda e: e.item.future.done()):
                    self._finish(entry.item, None, None)  # cancelled by its client
            if not self._pool.usable:
                self._fail_queued(unavailable(f"model '{self._name}' has no usable instance: {self._pool.reason}"),
                                  REJECTED)
            wait_until = None
            while self._pool.has_free:
                slot = self._pool.peek()
                assert slot is not None  # has_free was just checked, with no await in between
                go, need = self._granted(slot)
                if not go:
                    break
                try:
                    launched, wait_until = self._form_and_launch(slot, need, now_ns)
                except BaseException:
                    if need is not None and self._limiter is not None:
                        self._limiter.release(need)  # the driver dies: what it was granted goes back
                    raise
                if not launched:
                    break
            await self._sleep([d for d in (wait_until, self._queue.next_deadline_ns()) if d is not None])

    def _form_and_launch(self, slot: Slot, need: Requirement | None, now_ns: int) -> tuple[bool, int | None]:
        """Form a batch and run it on `slot` (True), or give the grant back and say when one is due."""
        decision = self._queue.form_batch(now_ns)
        if not decision.entries:
            if need is not None and self._limiter is not None:
                self._limiter.release(need)  # unused, so the turn is not charged
            return False, decision.wait_until_ns
        self._pool.take()
        if need is not None and self._limiter is not None:
            self._limiter.charge(self._limit_key, need)
        self._launch(slot, [e.item for e in decision.entries], now_ns, need)
        return True, None

    def _granted(self, slot: Slot) -> tuple[bool, Requirement | None]:
        """Whether `slot` may form a batch now, and the resources the limiter granted it for that batch
        (None: it needs none). Its turns are counted per model version, whichever instance runs them."""
        if self._limiter is None:
            return True, None
        if not len(self._queue):
            self._limiter.withdraw(self._limit_key)  # nothing queued: out of the line, and idle
            return False, None
        need = self._needs[min(slot.index, len(self._needs) - 1)]
        if need is None:
            return True, None
        if self._limiter.acquire(self._limit_key, need, self._wake):
            return True, need
        return False, None

    async def _sleep(self, deadlines_ns: list[int]) -> None:
        """Wait for a wake-up or the earliest deadline (clamped: a deadline far away is not a float overflow)."""
        if self._woken:
            return
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer: WakeHandle | None = None
        if deadlines_ns:
            deadline = min(min(deadlines_ns), time.monotonic_ns() + _MAX_WAIT_NS)
            timer = wake_at(loop, deadline, self._wake)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _crashed(self, exc: Exception) -> None:
        """The driver died: what it held may be what killed it, so fail it rather than retry it."""
        self._fail_queued(InferError(f"model '{self._name}': the scheduler failed ({describe(exc)}) and was "
                                     "restarted; the request was dropped", ErrorKind.INTERNAL), OTHER)

    def _fail_queued(self, error: InferError, reason: str) -> None:
        for entry in self._queue.remove(lambda e: True):
            self._finish(entry.item, error, None, reason)

    def _launch(self, slot: Slot, items: list[_Pending], start_ns: int, need: Requirement | None = None) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._batches.add(done)
        done.add_done_callback(self._batches.discard)
        if need is not None and self._limiter is not None:
            limiter = self._limiter
            done.add_done_callback(lambda _: limiter.release(need))
        requests = [p.request for p in items]
        self._pool.launch(slot, requests, lambda outcome: self._completed(items, requests, outcome, start_ns, done))

    def _completed(self, items: list[_Pending], requests: list[InferRequest], outcome: Outcome | None,
                   start_ns: int, done: asyncio.Future[None]) -> None:
        """On the loop, once per batch: `outcome` None means the batch was lost (the pool is closing)."""
        try:
            if outcome is not None:
                t = outcome.timings
                self._stats.execution(sum(r.batch_size for r in requests), len(requests), t.input_ns,
                                      t.infer_ns, t.output_ns)
                for pending, result in zip(items, outcome.results, strict=True):
                    self._finish(pending, result, start_ns - pending.arrival_ns)
        finally:  # whatever broke above, no request of this batch is left waiting
            for pending in items:
                if not pending.future.done():
                    self._finish(pending, InferError(f"model '{self._name}': the batch was lost", ErrorKind.INTERNAL),
                                 None)
            if not done.done():
                done.set_result(None)

    def _finish(self, pending: _Pending, result: Result | None, queue_ns: int | None, reason: str = BACKEND) -> None:
        """Resolve one request; a failure counts under `reason` (no result: cancelled by its client)."""
        ok = isinstance(result, dict) and not pending.future.done()
        if result is None or pending.future.cancelled():
            reason = CANCELED
        self._stats.request_done(ok, time.monotonic_ns() - pending.arrival_ns, queue_ns, reason)
        if pending.future.done() or result is None:
            return
        if isinstance(result, InferError):
            pending.future.set_exception(result)
        else:
            pending.future.set_result(result)

    async def close(self) -> None:
        """Reject queued requests, let running batches finish (within `_CLOSE_GRACE_S`), release instances."""
        self._closed = True
        await self._driver.stop()
        if self._limiter is not None:
            self._limiter.unregister(self._limit_key)
        self._fail_queued(unavailable("model is being unloaded"), REJECTED)
        if self._batches:
            await asyncio.wait(list(self._batches), timeout=_CLOSE_GRACE_S)
        await self._pool.close()
