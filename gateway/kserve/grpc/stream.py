"""ModelStreamInfer's delivery: answers wait in a bounded outbox, and every write has a deadline.

Requests on one stream run concurrently, at most `max_stream_inflight`: the stream reads
the next request only when one finishes, so gRPC flow control holds a fast sender back.
Their answers go to the stream's `Outbox`, and one writer hands them to grpc
(`context.write`), which waits while the client's flow-control window is full.

A client that stops reading is cut, and never holds anything up:
- an LLM delta is queued without waiting (`Outbox.push`): the engine never waits on a
  client. Once `max_stream_buffer_bytes` would wait unsent behind the write in progress,
  the stream ends with RESOURCE_EXHAUSTED;
- a classic answer (its model is done; only the answer waits) waits for room (`Outbox.put`);
- a write the client has not taken within `stream_write_timeout_s` ends the stream with
  DEADLINE_EXCEEDED.
Ending the stream cancels its requests: each one's engine request is aborted and its
admission slot freed; the call's RPC slot is freed as the handler returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
from tritonclient.grpc import service_pb2 as pb

from gateway.drain import Drain, shutting_down
from gateway.kserve.grpc.limits import GrpcLimits

log = logging.getLogger("sluice.kserve.grpc")
# How long a cut stream's status may take to go out; it waits behind the answers the client has
# not read, and grpc keeps it for the client if it reads again.
_STATUS_GRACE_S = 1.0

RunOne = Callable[[pb.ModelInferRequest, "Outbox"], Awaitable[None]]


def error_response(request_id: str, message: str) -> pb.ModelStreamInferResponse:
    return pb.ModelStreamInferResponse(error_message=message, infer_response=pb.ModelInferResponse(id=request_id))


class Outbox:
    """The answers of one stream waiting to be written, bounded in bytes (one event loop).

    At least one answer is always taken, whatever its size: the write deadline bounds it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        self.overflow: str | None = None  # why the stream is ending, once the bound was passed
        self.closed = False
        self.writing: asyncio.Timeout | None = None  # the deadline of the write in progress
        self._items: deque[tuple[Any, int]] = deque()
        self._ready = asyncio.Event()  # an answer is queued, or the outbox closed
        self._room = asyncio.Event()  # an answer left the queue

    def push(self, item: Any) -> None:
        """Queue without waiting. Past the bound the stream ends: the answer is dropped and the writer stopped."""
        size = item.ByteSize()
        if self.overflow is None and self._items and self.queued_bytes + size > self.max_bytes:
            self.overflow = (f"the client is not reading its answers: {self.queued_bytes + size} bytes would wait "
                             f"unsent, over this stream's bound of {self.max_bytes} (--max-stream-buffer-bytes)")
            self._ready.set()
            if self.writing is not None and not self.writing.expired():
                self.writing.reschedule(asyncio.get_running_loop().time())  # stop waiting on the client now
        if self.overflow is not None:
            return
        self._items.append((item, size))
        self.queued_bytes += size
        self._ready.set()

    async def put(self, item: Any) -> None:
        """Queue once the answer fits under the bound."""
        size = item.ByteSize()
        while self.overflow is None and self._items and self.queued_bytes + size > self.max_bytes:
            self._room.clear()
            await self._room.wait()
        self.push(item)

    def close(self) -> None:
        """No more answers will come: `next` returns None once the queue is empty."""
        self.closed = True
        self._ready.set()

    async def next(self) -> Any | None:
        """The next answer to write; None once the outbox closed and emptied, or overflowed."""
        while not self._items or self.overflow is not None:
            if self.closed or self.overflow is not None:
                return None
            self._ready.clear()
            await self._ready.wait()
        item, size = self._items.popleft()
        self.queued_bytes -= size
        self._room.set()
        return item


async def deliver(outbox: Outbox, context: grpc.aio.ServicerContext, write_timeout_s: float) -> None:
    """Write the outbox's answers until it closes; a stalled client is cut (see the module)."""
    try:
        while (item := await outbox.next()) is not None:
            async with asyncio.timeout(write_timeout_s) as deadline:
                outbox.writing = deadline
                try:
                    await context.write(item)
                finally:
                    outbox.writing = None
    except TimeoutError:
        if outbox.overflow is None:
            await cut(context, grpc.StatusCode.DEADLINE_EXCEEDED,
                      f"the client took no answer for {write_timeout_s:g} s (--stream-write-timeout-s); "
                      "the stream is ended and its requests cancelled")
    if outbox.overflow is not None:
        await cut(context, grpc.StatusCode.RESOURCE_EXHAUSTED, outbox.overflow + "; the stream is ended")


async def cut(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """End a stream whose client does not read. Its status waits behind the unread answers, so after a
    short grace the handler gives the call up; grpc still delivers the status to a client that reads on."""
    log.info("ModelStreamInfer cut (%s): %s", code.name, message)
    try:
        async with asyncio.timeout(_STATUS_GRACE_S):
            await context.abort(code, message)
    except TimeoutError:
        pass
    raise asyncio.CancelledError  # the handler ends now, its call state released


async def serve_stream(requests: AsyncIterator[pb.ModelInferRequest], context: grpc.aio.ServicerContext,
                       limits: GrpcLimits, drain: Drain, run_one: RunOne) -> None:
    """One ModelStreamInfer call: `run_one(request, outbox)` answers each request (errors included, by
    request id). While the server drains, requests that arrive are answered with an error and not run."""
    outbox = Outbox(limits.max_stream_buffer_bytes)
    slots = asyncio.Semaphore(limits.max_stream_inflight)
    tasks: set[asyncio.Task[None]] = set()

    async def one(request: pb.ModelInferRequest) -> None:
        try:
            await run_one(request, outbox)
        finally:
            slots.release()

    async def reader() -> None:
        try:
            incoming = aiter(requests)
            while True:
                await slots.acquire()
                request = await anext(incoming, None)
                if request is None:
                    break
                if drain.draining:
                    outbox.push(error_response(request.id, shutting_down().message))
                    slots.release()
                    continue
                task = asyncio.create_task(one(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*list(tasks), return_exceptions=True)
        finally:
            outbox.close()

    read_task = asyncio.create_task(reader())
    read_task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a broken request stream just ends it
    try:
        await deliver(outbox, context, limits.stream_write_timeout_s)
    finally:
        read_task.cancel()
        for task in list(tasks):
            task.cancel()  # each closes its dispatch: the engine request is aborted
