"""The outbox of a ModelStreamInfer stream: bounded in bytes, never blocking an LLM delta."""

from __future__ import annotations

import asyncio

from tritonclient.grpc import service_pb2 as pb

from gateway.kserve.grpc.stream import Outbox, error_response


def _answer(request_id: str, size: int) -> pb.ModelStreamInferResponse:
    return error_response(request_id, "x" * size)


async def test_a_push_past_the_bound_ends_the_stream_and_is_dropped() -> None:
    outbox = Outbox(4096)
    first, second = _answer("a", 3000), _answer("b", 3000)
    outbox.push(first)  # alone it is always taken, whatever its size
    outbox.push(second)
    assert outbox.overflow is not None and "bound of 4096 (--max-stream-buffer-bytes)" in outbox.overflow
    assert outbox.queued_bytes == first.ByteSize()
    assert await outbox.next() is None  # the writer stops: the stream is ended


async def test_an_answer_larger_than_the_bound_is_taken_when_nothing_waits() -> None:
    outbox = Outbox(4096)
    big = _answer("big", 10_000)
    outbox.push(big)
    assert outbox.overflow is None and await outbox.next() == big


async def test_put_waits_for_room_and_next_ends_once_closed() -> None:
    outbox = Outbox(4096)
    first, second = _answer("a", 3000), _answer("b", 3000)
    outbox.push(first)
    waiting = asyncio.create_task(outbox.put(second))
    await asyncio.sleep(0)
    assert not waiting.done() and outbox.overflow is None
    assert await outbox.next() == first
    await waiting
    outbox.close()
    assert await outbox.next() == second and await outbox.next() is None
