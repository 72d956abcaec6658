"""The live driver: one `SimEngine` stepped in real time on the event loop.

`run()` is the engine loop. While the engine has work it calls ``engine.step(now)``
with the loop's clock, sleeps until the step's ``end_s`` (the Python time spent
scheduling counts as part of the step; with the `zero` profile it only yields to
the loop), then delivers each output to its request's queue, publishes the
step's KV events and records TTFT. With no work it waits for `submit`.

`submit` returns the request's queue of `RequestOutput`s (the last one has a
finish reason) or, if the engine loop failed, the exception. `abort` is
idempotent. Not thread-safe: everything runs on one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time

from engines.sim.engine import RequestSpec, SimEngine
from engines.sim.metrics import SimMetrics
from engines.sim.outputs import RequestOutput, StepResult
from engines.sim.publisher import KVEventPublisher

log = logging.getLogger(__name__)

OutputQueue = asyncio.Queue[RequestOutput | Exception]


class EngineDriver:
    def __init__(self, engine: SimEngine, metrics: SimMetrics, publisher: KVEventPublisher | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.publisher = publisher
        self._queues: dict[str, OutputQueue] = {}
        self._wake = asyncio.Event()

    def submit(self, spec: RequestSpec) -> OutputQueue:
        """Queue a request now; ValueError if the engine refuses it."""
        self.engine.add_request(spec, asyncio.get_running_loop().time())
        queue: OutputQueue = asyncio.Queue()
        self._queues[spec.request_id] = queue
        self._wake.set()
        return queue

    def abort(self, request_id: str) -> None:
        self._queues.pop(request_id, None)
        self.engine.abort(request_id)

    async def run(self) -> None:
        """Step the engine until cancelled. A failing step fails the requests in flight, is logged,
        and the loop goes on, so one bad request cannot stop the worker."""
        loop = asyncio.get_running_loop()
        while True:
            if self.engine.next_event_time() is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                result = self.engine.step(loop.time())
                delay_s = result.end_s - loop.time()
                await asyncio.sleep(delay_s if delay_s > 0 else 0)
                await self._deliver(result)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("sim engine step failed; failing %d requests in flight", len(self._queues))
                self._fail_all(exc)

    async def _deliver(self, result: StepResult) -> None:
        for out in result.outputs:
            if out.ttft_s is not None:
                self.metrics.observe_ttft(out.ttft_s)
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
