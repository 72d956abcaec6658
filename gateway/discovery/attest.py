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
value = "<URL> <MAC>"), where every replica reads it. Writing Redis must not be enough to
admit a worker, so the MAC is HMAC-SHA256 over the name and URL with the attestation key
(SLUICE_ATTESTATION_KEY), which only the gateways hold; a replica admits a pair from Redis
only if the MAC verifies (hmac.compare_digest). Without that key the pair is not shared:
only the replica that took the registration admits the worker, as without Redis. If Redis
cannot be read, an endpoint not vouched for locally waits (fail closed); workers already
admitted stay.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
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
                 key: str = "sluice:attest", mac_key: str | None = None) -> None:
        self._local: dict[str, str] = {}  # worker name -> URL it registered with
        self._key = key
        self._mac_key = (mac_key or "").strip().encode("utf-8")  # used only with Redis, which needs a key
        self._redis = None if redis_url is None or mac_key is None else aioredis.Redis.from_url(
            redis_url, socket_timeout=1.0, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 1),
            **(options or {}))

    def _mac(self, name: str, url: str) -> str:
        message = b"sluice-attest\0" + name.encode("utf-8") + b"\0" + url.encode("utf-8")
        return hmac.new(self._mac_key, message, hashlib.sha256).hexdigest()

    async def vouch(self, name: str, url: str) -> None:
        """A worker registered with a `workers`-scope key under this name and URL."""
        self._local.pop(name, None)
        self._local[name] = _norm(url)
        while len(self._local) > _MAX_LOCAL:
            self._local.pop(next(iter(self._local)))
        if self._redis is not None:
            try:
                await self._redis.hset(self._key, name, f"{_norm(url)} {self._mac(name, _norm(url))}")
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
        if not isinstance(shared, bytes):
            return False
        stored, _, mac = shared.decode("utf-8", "replace").rpartition(" ")
        # The MAC in constant time: an entry written to Redis without the key admits nothing.
        good = hmac.compare_digest(mac.encode("utf-8"), self._mac(name, _norm(url)).encode("utf-8"))
        return good and stored == _norm(url)

    async def close(self) -> None:
        if self._redis is not None:
            try:
                await self._redis.aclose()
            except STORE_ERRORS:
                pass


def _norm(url: str) -> str:
    return url.rstrip("/")
