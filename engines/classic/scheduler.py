"""The async driver of one model version's dynamic batcher.

The pure decisions live in `batching.BatchQueue`; this module only moves
requests between asyncio futures, the queue and the model instances:

- `submit()` enqueues (or raises UNAVAILABLE when the queue is full) and awaits
  the result; cancelling the awaiting task drops the request if not yet running.
- One driver task wakes on new work, on a freed instance, at the batcher's
  delay deadline and at the earliest queue timeout, so timed-out requests are
  rejected even while every instance is busy.
- Each instance runs on its own worker thread; a batch never blocks the loop.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from engines.classic.backends.base import Backend
from engines.classic.batching import BatcherConfig, BatchQueue, QueueFull
from engines.classic.errors import Code, InferError, unavailable
from engines.classic.proto import ModelConfig
from engines.classic.request import InferRequest
from engines.classic.stats import ModelStats


@dataclass(slots=True)
class _Pending:
    request: InferRequest
    future: asyncio.Future[dict[str, np.ndarray]]
    arrival_ns: int


class Scheduler:
    def __init__(self, config: ModelConfig, instances: list[Backend], stats: ModelStats) -> None:
        if not instances:
            raise ValueError("a scheduler needs at least one model instance")
        self._queue = BatchQueue(BatcherConfig.from_model_config(config))
        self._instances = list(instances)
        self._free = list(instances)
        self._stats = stats
        # One thread per instance: instances run truly concurrently, and a python
        # model blocked in a BLS call cannot starve another model's threads.
        self._executor = ThreadPoolExecutor(len(instances), thread_name_prefix=f"sluice-{config.name}")
        self._wake = asyncio.Event()
        self._driver: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()
        self._closed = False

    def start(self) -> None:
        self._driver = asyncio.get_running_loop().create_task(self._drive(), name="sluice-scheduler")

    async def submit(self, request: InferRequest) -> dict[str, np.ndarray]:
        """Run one validated request; raises InferError (UNAVAILABLE for full queue / timeout)."""
        if self._closed:
            raise unavailable(f"model '{request.model}' is unloading")
        now_ns = time.monotonic_ns()
        self._stats.request_started()
        future: asyncio.Future[dict[str, np.ndarray]] = asyncio.get_running_loop().create_future()
        pending = _Pending(request, future, now_ns)
        try:
            self._queue.push(pending, request.batch_size, request.batch_key, request.priority,
                             request.timeout_us, now_ns)
        except QueueFull as exc:
            self._stats.request_done(False, time.monotonic_ns() - now_ns)
            raise unavailable(str(exc)) from None
        self._wake.set()
        try:
            return await future
        except asyncio.CancelledError:
            self._wake.set()  # let the driver drop the cancelled entry and free its queue slot now
            raise

    async def _drive(self) -> None:
        while True:
            self._wake.clear()
            now_ns = time.monotonic_ns()
            for entry in self._queue.expire(now_ns):
                self._finish(entry.item, unavailable("Request timeout expired"), None)
            for entry in self._queue.remove(lambda e: e.item.future.done()):
                self._finish(entry.item, None, None)  # cancelled by its client
            wait_until = None
            while self._free:
                decision = self._queue.form_batch(now_ns)
                if not decision.entries:
                    wait_until = decision.wait_until_ns
                    break
                self._launch(self._free.pop(), [e.item for e in decision.entries], now_ns)
            deadlines = [d for d in (wait_until, self._queue.next_deadline_ns()) if d is not None]
            timeout_s = max(0.0, (min(deadlines) - time.monotonic_ns()) / 1e9) if deadlines else None
            try:
                await asyncio.wait_for(self._wake.wait(), timeout_s)
            except TimeoutError:
                pass

    def _launch(self, instance: Backend, items: list[_Pending], start_ns: int) -> None:
        task = asyncio.get_running_loop().create_task(self._execute(instance, items, start_ns))
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)

    async def _execute(self, instance: Backend, items: list[_Pending], start_ns: int) -> None:
        requests = [p.request for p in items]
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self._executor, instance.execute, requests)
        except Exception as exc:  # the backend broke its contract; fail this batch only
            results = [InferError(f"model '{requests[0].model}' failed: {exc}", Code.INTERNAL)] * len(items)
        finally:
            self._free.append(instance)
            self._wake.set()
        if len(results) != len(items):  # a request without its result would wait forever
            results = [InferError(f"model '{requests[0].model}' returned {len(results)} results for "
                                  f"{len(items)} requests", Code.INTERNAL)] * len(items)
        t = instance.timings
        self._stats.execution(sum(r.batch_size for r in requests), len(requests), t.input_ns, t.infer_ns,
                              t.output_ns)
        for pending, result in zip(items, results, strict=True):
            self._finish(pending, result, start_ns - pending.arrival_ns)

    def _finish(self, pending: _Pending, result: dict[str, np.ndarray] | InferError | None,
                queue_ns: int | None) -> None:
        ok = isinstance(result, dict) and not pending.future.done()
        self._stats.request_done(ok, time.monotonic_ns() - pending.arrival_ns, queue_ns)
        if pending.future.done() or result is None:
            return
        if isinstance(result, InferError):
            pending.future.set_exception(result)
        else:
            pending.future.set_result(result)

    async def close(self) -> None:
        """Reject queued requests, let running batches finish, then release the instances."""
        self._closed = True
        if self._driver is not None:
            self._driver.cancel()
            await asyncio.gather(self._driver, return_exceptions=True)
        for entry in self._queue.remove(lambda e: True):
            self._finish(entry.item, unavailable("model is being unloaded"), None)
        if self._batches:
            await asyncio.gather(*self._batches, return_exceptions=True)
        loop = asyncio.get_running_loop()
        for instance in self._instances:
            await loop.run_in_executor(self._executor, instance.close)
        self._executor.shutdown(wait=False)
