"""The KServe gRPC server's one interceptor: what every call passes before the servicer runs.

grpc.aio reads a unary call's request message before it runs the handler, and its own
`maximum_concurrent_rpcs` counts a call from its first header: calls that send metadata and
then never their message would hold every slot, health probes included. So the gate serves
every method as a stream-request handler (the wire is the same) and decides, before any
message is read:

1. ServerLive and ServerReady answer at once: their (empty) message is never read, they wait
   on nothing, and no bound counts them.
2. While the server drains (SIGTERM, `gateway.drain`), every other call gets UNAVAILABLE with
   a `retry-after` trailer.
3. Access (`gateway.security.grpc.GrpcAccess`): the key and its quotas, from the metadata
   alone. A refused call ends here, having held nothing.
4. An RPC slot: at most `max_concurrent_rpcs` admitted calls at once, else RESOURCE_EXHAUSTED.
   The call also counts among the drain's requests in flight until it ends.
5. A unary call's message must arrive within `message_timeout_s`, else DEADLINE_EXCEEDED.

Streaming handlers write with `context.write` (the stream bounds its own writes:
`gateway.kserve.grpc.stream`); they get the request iterator as it is.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from gateway.drain import RETRY_AFTER_S, Drain, shutting_down
from gateway.kserve.errors import grpc_status
from gateway.kserve.grpc.limits import GrpcLimits
from gateway.security.access import Access, classify_rpc
from gateway.security.grpc import GrpcAccess

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]
Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


async def end_call(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str,
                   retry_after_s: float | None = None) -> NoReturn:
    """Abort the call with `code` and `message` (and a `retry-after` trailer)."""
    trailer = () if retry_after_s is None else (("retry-after", str(max(1, round(retry_after_s)))),)
    await context.abort(code, message, trailing_metadata=trailer)
    raise AssertionError("grpc's abort returned")  # it raises; this tells type checkers so


class CallGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc ships no stubs
    def __init__(self, limits: GrpcLimits, access: GrpcAccess | None, drain: Drain) -> None:
        self.limits = limits
        self.access = access
        self.drain = drain
        self.running = 0  # admitted calls in progress (the RPC slots taken)
        # The wrapped handler of each method, built on its first call: the servicer's handlers never change.
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(self, continuation: Continuation,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        wrapped = self._wrapped.get(details.method)
        if wrapped is None:
            handler = await continuation(details)
            if handler is None:
                return None  # an unknown method is not cached: clients choose those names
            wrapped = self._wrapped[details.method] = self._wrap(handler, classify_rpc(details.method))
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler, access: Access) -> grpc.RpcMethodHandler:
        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
        behavior = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
        if inspect.isasyncgenfunction(behavior):
            raise TypeError("KServe stream handlers write with context.write, within the stream's write deadline")
        if access is Access.OPEN and handler.unary_unary is not None:
            gated = self._open(behavior, handler.request_deserializer)
        else:
            gated = self._admitted(behavior, access, unary_request=not handler.request_streaming)
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(gated, **kw)
        return grpc.stream_unary_rpc_method_handler(gated, **kw)

    @staticmethod
    def _open(behavior: Behavior, deserialize: Callable[[bytes], Any]) -> Behavior:
        empty = deserialize(b"")  # the health requests carry no fields

        async def answer(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            return await behavior(empty, context)
        return answer

    def _admitted(self, behavior: Behavior, access: Access, unary_request: bool) -> Behavior:
        async def call(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            if self.drain.draining:
                error = shutting_down()
                await end_call(context, grpc_status(error), error.message, RETRY_AFTER_S)
            lease = await self.access.enter(context, access, count=unary_request) if self.access else None
            try:
                if self.running >= self.limits.max_concurrent_rpcs:
                    await end_call(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"the server has {self.running} RPCs in progress, its bound; retry later",
                                   RETRY_AFTER_S)
                self.running += 1
                self.drain.enter()
                try:
                    request = await self._message(requests, context) if unary_request else requests
                    return await behavior(request, context)
                finally:
                    self.running -= 1
                    self.drain.exit()
            finally:
                if self.access is not None:
                    self.access.leave(lease)
        return call

    async def _message(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        timeout_s = self.limits.message_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                request = await anext(aiter(requests), None)
        except TimeoutError:
            await end_call(context, grpc.StatusCode.DEADLINE_EXCEEDED,
                           f"the request message did not arrive within {timeout_s:g} s")
        if request is None:
            await end_call(context, grpc.StatusCode.INVALID_ARGUMENT, "the call ended without its request message")
        return request
