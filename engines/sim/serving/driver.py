"""The live driver: one `SimEngine` stepped in real time on the event loop.

`run()` is the engine loop. While the engine has work it steps it and sleeps until
the step's ``end_s`` (with the `zero` profile it only yields to the loop), then
delivers each output to its request's queue, publishes the step's KV events and
records TTFT. With no work it waits for `submit`.

Steps are laid end to end on the loop's clock: while the engine stays busy, a step
starts when the previous one ended, not when the loop got round to it, so the time
spent scheduling and writing chunks is part of a step instead of being added to it
(up to `CATCH_UP_S` of lateness; a loop further behind starts afresh from now rather
than bursting steps to catch up); a request that arrived after such a step's start
waits for the next one. After an idle spell a step starts when it is due.

`submit` returns the request's queue of `RequestOutput`s (the last one has a
finish reason) or, if the engine loop failed, the exception. `abort` is
idempotent. Not thread-safe: everything runs on one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time

from engines.sim.model.engine import RequestSpec, SimEngine
from engines.sim.model.outputs import RequestOutput, StepResult
from engines.sim.serving.metrics import SimMetrics
from engines.sim.serving.publisher import KVEventPublisher

log = logging.getLogger(__name__)

OutputQueue = asyncio.Queue[RequestOutput | Exception]
CATCH_UP_S = 0.02
# asyncio's selector rounds a sleep up to the next millisecond, so a sleep ends 0.5 ms late on
# average; ending it that much earlier centres deliveries on the modelled times.
TIMER_SLACK_S = 0.0005


class EngineDriver:
    def __init__(self, engine: SimEngine, metrics: SimMetrics, publisher: KVEventPublisher | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.publisher = publisher
        self._queues: dict[str, OutputQueue] = {}
        self._wake = asyncio.Event()
        self._busy = False  # the previous step left work: the next one follows it directly

    def submit(self, spec: RequestSpec) -> OutputQueue:
        """Queue a request now; ValueError if the engine refuses it."""
        now = asyncio.get_running_loop().time()
        self.engine.add_request(spec, now)
        queue: OutputQueue = asyncio.Queue()
        self._queues[spec.request_id] = queue
        self._wake.set()
        return queue

    def abort(self, request_id: str) -> None:
        self._queues.pop(request_id, None)
        if self.engine.abort(request_id):
            self._wake.set()

    async def run(self) -> None:
        """Step the engine until cancelled. A failing step fails the requests in flight, is logged,
        and the loop goes on, so one bad request cannot stop the worker."""
        loop = asyncio.get_running_loop()
        while True:
            due = self.engine.next_event_time()
            if due is None:
                self._busy = False
                await self._wait_for_work(None)
                continue
            now = loop.time()
            # A step due later (the next request is still in its request latency) is taken now and
            # slept through with its latency in one sleep: nothing arriving meanwhile could join it.
            start = due if due > now else self._start_time(now)
            try:
                result = self.engine.step(start)
                delay_s = result.end_s - loop.time() - TIMER_SLACK_S
                await asyncio.sleep(delay_s if delay_s > 0 else 0)
                await self._deliver(result)
                self._busy = not result.idle
                if result.idle:  # nothing could run (no room yet): do not spin
                    await self._wait_for_work(0.001)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("sim engine step failed; failing %d requests in flight", len(self._queues))
                self._fail_all(exc)

    async def _wait_for_work(self, timeout_s: float | None) -> None:
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        except TimeoutError:
            pass

    def _start_time(self, now: float) -> float:
        previous_end = self.engine.next_event_time()
        if self._busy and previous_end is not None and 0.0 <= now - previous_end <= CATCH_UP_S:
            return previous_end
        return now

    async def _deliver(self, result: StepResult) -> None:
        for out in result.outputs:
            if out.ttft_s is not None:
                self.metrics.observe_ttft(out.ttft_s)
            if out.itl_s is not None:
                self.metrics.observe_itl(out.itl_s)
            queue = self._queues.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)
                if out.finish_reason is not None:
                    del self._queues[out.request_id]
        if result.kv_events and self.publisher is not None:
            await self.publisher.publish(result.kv_events, time.time())

    def _fail_all(self, exc: Exception) -> None:
        for request_id, queue in list(self._queues.items()):
            queue.put_nowait(exc)
            self.engine.abort(request_id)
        self._queues.clear()
