"""The instances of one model version, each on its own thread, under the execute time limit.

Every method runs on the event loop and none blocks it, but for batches measured cheap enough
to run on the loop itself (engines/classic/execution/inline.py). Contract:
- `take()` hands out a free instance (or None); `launch(slot, requests, on_done)` executes
  one batch on that instance's thread (or on the loop, when its gate says so), gives the slot
  back and calls `on_done(outcome)` on the loop (`await run(slot, requests)` is the same as a
  coroutine). It returns exactly one result per request and never raises: a backend that
  raises, even SystemExit, fails its batch only.
- A batch still running after the time limit fails with UNAVAILABLE at the limit.
  Python cannot stop a thread, so the instance is abandoned (its thread stays in the
  model's code) and a replacement is built from the model's files, while at most
  `max_abandoned` instances are abandoned at once. An abandoned instance that returns
  later is put back in service if the pool is short, else closed. Backends that
  enforce the limit themselves (`Backend.enforces_time_limit`: a model in its own
  process kills it) are never abandoned.
- `usable` is False once no instance is left and none is being built; `reason` says why.
- `on_change()` is called whenever an instance becomes free or the pool loses one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from engines.classic.errors import ConfigError, InferError
from engines.classic.execution.backends.base import Backend, ComputeTimes
from engines.classic.execution.inline import InlineGate
from engines.classic.execution.threads import Worker, describe
from engines.errors import ErrorKind

if TYPE_CHECKING:
    from engines.classic.request import InferRequest

log = logging.getLogger("sluice.classic")
Result = dict[str, np.ndarray] | InferError


class Outcome(NamedTuple):
    results: list[Result]
    timings: ComputeTimes


@dataclass(slots=True, eq=False)
class Slot:
    index: int
    instance: Backend
    worker: Worker
    gate: InlineGate


def _execute(instance: Backend, requests: list[InferRequest]) -> Outcome:
    """On the instance's thread (or the loop): one batch, one result per request whatever happens."""
    model = instance.config.name
    try:
        results: list[Result] = list(instance.execute(requests))
    except BaseException as exc:  # model code: even SystemExit fails the batch, not the server
        return Outcome([InferError(f"model '{model}' failed: {describe(exc)}", ErrorKind.INTERNAL)] * len(requests),
                       ComputeTimes())
    if len(results) != len(requests):  # a request without its result would wait forever
        results = [InferError(f"model '{model}' returned {len(results)} results for {len(requests)} requests",
                              ErrorKind.INTERNAL)] * len(requests)
    return Outcome(results, instance.timings)


class InstancePool:
    def __init__(self, name: str, factory: Callable[[int], Backend], time_limit_s: float,
                 on_change: Callable[[], None]) -> None:
        self._name = name
        self._factory = factory  # instance index -> a new instance; blocking, run on its own thread
        self._limit_s = time_limit_s  # 0: no limit
        self.on_change = on_change
        self._live: list[Slot] = []  # free or running a batch
        self._free: list[Slot] = []
        self._abandoned: set[Slot] = set()
        self._building: set[asyncio.Task[None]] = set()
        self._target = 0
        self.max_abandoned = 0
        self.reason = ""
        self._closed = False

    async def start(self, count: int) -> None:
        """Build `count` instances, one after another; raises ConfigError (closing those built) on failure."""
        self._target = self.max_abandoned = count
        try:
            for index in range(count):
                self._add(await self._build(index))
        except BaseException:
            await self.close()
            raise

    @property
    def usable(self) -> bool:
        return bool(self._live) or bool(self._building)

    @property
    def has_free(self) -> bool:
        return bool(self._free)

    def take(self) -> Slot | None:
        return self._free.pop() if self._free else None

    def peek(self) -> Slot | None:
        """The slot `take` would return, left free."""
        return self._free[-1] if self._free else None

    def launch(self, slot: Slot, requests: list[InferRequest], on_done: Callable[[Outcome], None]) -> None:
        """Execute one batch on the slot's thread; `on_done(outcome)` runs on the loop exactly once: when
        the batch returns (the slot is free again by then), or at the time limit (the instance abandoned).
        Callbacks rather than a task per batch: the loop's cost per batch is one callback. A batch the
        slot's gate finds cheap runs on the loop instead (engines/classic/execution/inline.py)."""
        rows = sum(r.batch_size for r in requests)
        if slot.gate.wants(rows):
            outcome = _execute(slot.instance, requests)
            slot.gate.observe(outcome.timings.total_ns, rows, inline=True)
            # Both as callbacks: the driver yields between batches (responses go out, deadlines are
            # checked) instead of running its whole queue on the loop in one pass.
            loop = asyncio.get_running_loop()
            loop.call_soon(self._give_back, slot)
            loop.call_soon(on_done, outcome)
            return
        future = slot.worker.submit(_execute, slot.instance, requests)
        limit = None if not self._limit_s or slot.instance.enforces_time_limit else self._limit_s
        timer: asyncio.TimerHandle | None = None
        finished = False

        def returned(f: asyncio.Future[Outcome]) -> None:
            nonlocal finished
            if timer is not None:
                timer.cancel()
            if finished:
                return  # it was abandoned at the limit; `_returned` takes it from here
            finished = True
            self._give_back(slot)
            exc = f.exception()
            if exc is None:
                slot.gate.observe(f.result().timings.total_ns, rows, inline=False)
            on_done(f.result() if exc is None else Outcome(
                [InferError(f"model '{self._name}' failed: {describe(exc)}", ErrorKind.INTERNAL)] * len(requests),
                ComputeTimes()))

        def expired() -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            replaced = self._abandon(slot, future)
            message = (f"model '{self._name}' execute() exceeded its time limit of {self._limit_s:g} s; "
                       + ("the instance is being replaced" if replaced else self.reason))
            on_done(Outcome([InferError(message, ErrorKind.UNAVAILABLE)] * len(requests), ComputeTimes()))

        future.add_done_callback(returned)
        if limit is not None:
            timer = asyncio.get_running_loop().call_later(limit, expired)

    async def run(self, slot: Slot, requests: list[InferRequest]) -> Outcome:
        """`launch` as a coroutine (the batch is not cancelled with it: it still returns its slot)."""
        done: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()

        def finish(outcome: Outcome) -> None:
            if not done.done():
                done.set_result(outcome)
        self.launch(slot, requests, finish)
        return await asyncio.shield(done)

    def _give_back(self, slot: Slot) -> None:
        if slot in self._live and not self._closed:
            self._free.append(slot)
            self.on_change()

    def _add(self, slot: Slot) -> None:
        self._live.append(slot)
        self._free.append(slot)

    async def _build(self, index: int) -> Slot:
        worker = Worker(f"sluice-{self._name}-{index}")
        try:
            instance = await worker.submit(self._factory, index)
        except ConfigError:
            worker.stop()
            raise
        except Exception as exc:
            worker.stop()
            raise ConfigError(f"model '{self._name}': creating instance {index} failed: {describe(exc)}") from None
        return Slot(index, instance, worker, InlineGate(instance.inline_ok, self._name))

    def _abandon(self, slot: Slot, future: asyncio.Future[Outcome]) -> bool:
        self._live.remove(slot)
        self._abandoned.add(slot)
        log.error("model %s instance %d: execute() exceeded %g s; abandoning its thread", self._name, slot.index,
                  self._limit_s)
        future.add_done_callback(lambda _: self._returned(slot))
        replaced = len(self._abandoned) <= self.max_abandoned
        if replaced:
            self._replace(slot.index)
        else:
            self.reason = (f"{len(self._abandoned)} instances are stuck in execute() past the time limit; no "
                           "replacement is built until one returns")
            log.error("model %s: %s", self._name, self.reason)
        self.on_change()
        return replaced

    def _returned(self, slot: Slot) -> None:
        """A hung execute() finally returned: reuse the instance if the pool is short, else close it."""
        self._abandoned.discard(slot)
        if not self._closed and len(self._live) + len(self._building) < self._target:
            log.warning("model %s instance %d returned from a hung execute(); back in service", self._name,
                        slot.index)
            self._add(slot)
            self.on_change()
            return
        slot.worker.submit(slot.instance.close)
        slot.worker.stop()

    def _replace(self, index: int) -> None:
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._rebuild(index), name=f"sluice-{self._name}-rebuild")
        self._building.add(task)
        task.add_done_callback(self._building.discard)

    async def _rebuild(self, index: int) -> None:
        try:
            slot = await self._build(index)
        except ConfigError as exc:
            self.reason = f"a replacement instance failed to load: {exc}"
            log.error("model %s: %s", self._name, self.reason)
        else:
            if self._closed:
                slot.worker.submit(slot.instance.close)
                slot.worker.stop()
            else:
                log.info("model %s: replacement instance %d ready", self._name, index)
                self._add(slot)
        finally:
            asyncio.get_running_loop().call_soon(self.on_change)  # after this task left `_building`

    async def close(self, grace_s: float = 10.0) -> None:
        """Release every instance; a `close()` (finalize) that hangs is abandoned after `grace_s`."""
        self._closed = True
        if self._building:
            await asyncio.gather(*self._building, return_exceptions=True)
        slots, self._live, self._free = self._live, [], []
        closing = [s.worker.submit(s.instance.close) for s in slots]
        if closing:
            await asyncio.wait(closing, timeout=grace_s)
        for slot in slots:
            slot.worker.stop()
