"""The gRPC edge of access control: a grpc.aio server interceptor.

It wraps every handler so that, before the servicer runs, the `authorization`
metadata (`Bearer <key>`) is checked against what the RPC needs
(`classify_rpc`: ServerLive/ServerReady open, repository load/unload admin,
everything else an API key) and the key's quotas admit the call. Refusals abort
with the code `status_of` maps the domain error to (UNAUTHENTICATED,
PERMISSION_DENIED, RESOURCE_EXHAUSTED with a `retry-after` trailer). The key id
of an admitted API call is put in `current_key_id` for the servicer.

A streaming call holds one concurrency slot while it is open; the servicer
counts each request on the stream against the key's requests per minute.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from engines.errors import SluiceError
from gateway.security.access import Access, bearer, classify_rpc, current_key_id, grpc_peer_host, is_local
from gateway.security.guard import Security
from gateway.security.quotas import Lease

StatusOf = Callable[[SluiceError], grpc.StatusCode]
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class AccessInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc ships no stubs
    def __init__(self, security: Security, status_of: StatusOf) -> None:
        self.security = security
        self.status_of = status_of
        # The wrapped handler of each method, built on its first call: the servicer's handlers never
        # change, and building one per call cost more than the check itself.
        self._wrapped: dict[str, grpc.RpcMethodHandler | None] = {}

    async def intercept_service(self, continuation: Continuation,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        try:
            return self._wrapped[method]
        except KeyError:
            pass
        handler = await continuation(details)
        if handler is None:
            return None  # an unknown method is not cached: clients choose those names
        wrapped = self._wrap(handler, classify_rpc(method))
        self._wrapped[method] = wrapped
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler, access: Access) -> grpc.RpcMethodHandler:
        if access is Access.OPEN:
            return handler
        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(self._unary(handler.unary_unary, access, True), **kw)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(self._unary(handler.stream_unary, access, False), **kw)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(self._stream(handler.unary_stream, access, True), **kw)
        return grpc.stream_stream_rpc_method_handler(self._stream(handler.stream_stream, access, False), **kw)

    def _unary(self, behavior: Any, access: Access, count: bool) -> Any:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            lease = await self._enter(context, access, count)
            try:
                return await behavior(request, context)
            finally:
                self._leave(lease)
        return wrapped

    def _stream(self, behavior: Any, access: Access, count: bool) -> Any:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            lease = await self._enter(context, access, count)
            try:
                async for response in behavior(request, context):
                    yield response
            finally:
                self._leave(lease)
        return wrapped

    async def _enter(self, context: grpc.aio.ServicerContext, access: Access, count: bool) -> Lease | None:
        metadata: dict[str, Any] = {}
        for key, value in context.invocation_metadata() or ():
            metadata.setdefault(key.lower(), value)
        token = metadata.get("authorization")
        try:
            # Only admin RPCs care whether the peer is local: the peer is parsed for them alone.
            local = access is Access.ADMIN and is_local(grpc_peer_host(context.peer() or ""), set(metadata))
            principal = self.security.authenticate(access, bearer(token if isinstance(token, str) else None),
                                                   local=local)
            if access is not Access.API or principal is None:
                return None
            lease = await self.security.quotas.admit(principal.id, count=count)
        except SluiceError as e:
            if e.retry_after_s is not None:
                context.set_trailing_metadata((("retry-after", str(max(1, round(e.retry_after_s)))),))
            await context.abort(self.status_of(e), e.message)
            raise  # abort raises; this line only tells type checkers so
        # Each RPC runs in its own task and Context, so the value ends with the call.
        current_key_id.set(principal.id)
        return lease

    def _leave(self, lease: Lease | None) -> None:
        if lease is not None:
            self.security.quotas.finish(lease)
