"""The gRPC edge of access control: one call's check, from its metadata alone.

The KServe call gate (`gateway.kserve.grpc.gate`) runs `GrpcAccess.enter` first, before
the call's message is read or it takes an RPC slot: the `authorization`
metadata (`Bearer <key>`) is checked against what the RPC needs
(`classify_rpc`: ServerLive/ServerReady open, repository load/unload an admin
key with the `repository` scope, everything else an API key) and the key's quotas admit the call. Refusals abort
with the code `status_of` maps the domain error to (UNAUTHENTICATED,
PERMISSION_DENIED, RESOURCE_EXHAUSTED with a `retry-after` trailer). The key id
of an admitted API call is put in `current_key_id` for the servicer.

A streaming call holds one concurrency slot while it is open; the servicer
counts each request on the stream against the key's requests per minute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from engines.errors import SluiceError
from gateway.security.access import ADMIN, Access, bearer, current_key_id, grpc_peer_host, is_local
from gateway.security.guard import Security
from gateway.security.quotas import Lease

StatusOf = Callable[[SluiceError], grpc.StatusCode]


class GrpcAccess:
    def __init__(self, security: Security, status_of: StatusOf) -> None:
        self.security = security
        self.status_of = status_of

    async def enter(self, context: grpc.aio.ServicerContext, access: Access, count: bool) -> Lease | None:
        """Authenticate and admit one call (`count`: against its key's requests per minute), or abort it.
        Reads the call's metadata and peer only, never its message."""
        metadata: dict[str, Any] = {}
        for key, value in context.invocation_metadata() or ():
            metadata.setdefault(key.lower(), value)
        token = metadata.get("authorization")
        try:
            # Only admin RPCs care whether the peer is local: the peer is parsed for them alone.
            local = access in ADMIN and is_local(grpc_peer_host(context.peer() or ""), set(metadata))
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

    def leave(self, lease: Lease | None) -> None:
        if lease is not None:
            self.security.quotas.finish(lease)
