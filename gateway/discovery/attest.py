"""Which discovered endpoints may be routed to: those that proved they hold the registration key.

A label on a Service is not a credential: anyone who may create a Service (or an
EndpointSlice) with the worker label could otherwise point the gateway at a pod of
theirs and receive every prompt routed there. So discovery admits an endpoint only
once a worker with the same name *and* URL has registered through
`POST /v1/admin/workers` with a key holding the `workers` scope (the registration
key every worker pod holds: `sluice worker --gateway` sends it). The registration
vouches for that (name, URL) pair; discovery then only follows the pair's readiness,
drain and removal. A `DELETE /v1/admin/workers/{name}` withdraws it.

A worker registers through the gateway Service, so it reaches one replica; with
`--redis-url` the pair is also written to Redis (hash `sluice:attest`, field = name,
value = URL), where every replica reads it. Without Redis only the replica that took
the registration admits the worker. If Redis cannot be read, an endpoint not vouched
for locally waits (fail closed); workers already admitted stay.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

STORE_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
log = logging.getLogger("sluice.discovery")
_MAX_LOCAL = 4096  # pairs remembered in process; the oldest go first


class Attestations:
    def __init__(self, redis_url: str | None = None, options: dict[str, Any] | None = None,
                 key: str = "sluice:attest") -> None:
        self._local: dict[str, str] = {}  # worker name -> URL it registered with
        self._key = key
        self._redis = None if redis_url is None else aioredis.Redis.from_url(
            redis_url, socket_timeout=1.0, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 1),
            **(options or {}))

    async def vouch(self, name: str, url: str) -> None:
        """A worker registered with a `workers`-scope key under this name and URL."""
        self._local.pop(name, None)
        self._local[name] = _norm(url)
        while len(self._local) > _MAX_LOCAL:
            self._local.pop(next(iter(self._local)))
        if self._redis is not None:
            try:
                await self._redis.hset(self._key, name, _norm(url))
            except STORE_ERRORS as e:
                log.warning("attestations: cannot share the registration of %s through Redis (%s); only this "
                            "replica admits it", name, type(e).__name__)

    async def revoke(self, name: str) -> None:
        self._local.pop(name, None)
        if self._redis is not None:
            try:
                await self._redis.hdel(self._key, name)
            except STORE_ERRORS as e:
                log.warning("attestations: cannot withdraw %s in Redis (%s)", name, type(e).__name__)

    async def vouched(self, name: str, url: str) -> bool:
        if self._local.get(name) == _norm(url):
            return True
        if self._redis is None:
            return False
        try:
            shared = await self._redis.hget(self._key, name)
        except STORE_ERRORS:
            return False  # fail closed: it is retried with the pending endpoints
        return isinstance(shared, bytes) and shared.decode("utf-8", "replace") == _norm(url)

    async def close(self) -> None:
        if self._redis is not None:
            try:
                await self._redis.aclose()
            except STORE_ERRORS:
                pass


def _norm(url: str) -> str:
    return url.rstrip("/")
