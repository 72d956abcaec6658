"""Quotas shared by gateway replicas through Redis: the `LocalQuotas` operations as Lua scripts.

Each script runs atomically on the Redis server and reads the server's clock
(`TIME`), so replicas with skewed clocks agree. Per key id (`{k}` is a hash tag,
so a key's entries share a cluster slot):

* `{prefix}:{k}:rpm`, `{prefix}:{k}:tpm` -- a GCRA bucket's tat in microseconds,
  with a TTL that ends when the bucket has drained;
* `{prefix}:{k}:slots` -- a sorted set of concurrency leases, member = lease id,
  score = expiry. The replica holding a lease renews it while its request runs; a
  replica that dies stops renewing and its leases expire after `lease_ttl_s`, so
  slots cannot leak. Expired leases are dropped before every count.

Calls raise `STORE_ERRORS` when Redis cannot be reached; `QuotaService` then
falls back to its local store. A Redis that answers but refuses the credentials
(password, ACL user, permissions) or whose TLS certificate does not verify is a
configuration error instead: `check` raises `RedisAccessError` and start-up fails.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any
from urllib.parse import urlparse

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError

from gateway.security.keys import Limits
from gateway.security.quota_buckets import WINDOW_S, Refusal

STORE_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
_WINDOW_US = int(WINDOW_S * 1_000_000)

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
"""

# Drain-aware bucket update; shared by the request and token scripts.
_BUCKET = """
local function bucket(key, cost, interval, check)
  local tat = tonumber(redis.call('GET', key) or now)
  if tat < now then tat = now end
  local new = tat + cost * interval
  if new < now then new = now end
  if check and new - now > WINDOW then return math.ceil(new - now - WINDOW) end
  if new > now then
    redis.call('SET', key, string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000) + 1000)
  else
    redis.call('DEL', key)
  end
  return 0
end
""".replace("WINDOW", str(_WINDOW_US))

# KEYS: rpm bucket, slots. ARGV: rpm interval us (0: no rpm), concurrency limit (0: none), lease id ('' : no slot),
# lease ttl ms. -> {1, '', 0} admitted, or {0, reason, retry after us}.
_ADMIT = _NOW + _BUCKET + """
local limit = tonumber(ARGV[2])
local hold = limit > 0 and ARGV[3] ~= ''
if hold then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= limit then return {0, 'concurrency', 1000000} end
end
local interval = tonumber(ARGV[1])
if interval > 0 then
  local wait = bucket(KEYS[1], 1, interval, true)
  if wait > 0 then return {0, 'rpm', wait} end
end
if hold then
  local ttl = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[2], now + ttl * 1000, ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ttl * 2)
end
return {1, '', 0}
"""

# KEYS: tpm bucket. ARGV: interval us per token, tokens (negative: refund), '1' to check. -> retry after us, or 0.
_TOKENS = _NOW + _BUCKET + """
return bucket(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[1]), ARGV[3] == '1')
"""

# KEYS: slots. ARGV: lease id, ttl ms. Extends a lease that still exists.
_RENEW = _NOW + """
if redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]) * 1000, ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
end
return 1
"""


class RedisAccessError(Exception):
    """Redis answered but refused this gateway: wrong password or ACL user, missing permission, bad TLS."""


class RedisQuotaStore:
    label = "Redis"
    renews_idle = False  # leases expire there on their own; with none, the maintainer only pings

    def __init__(self, url: str, *, prefix: str = "sluice:quota", socket_timeout_s: float = 0.5,
                 lease_ttl_s: float = 30.0, options: dict[str, Any] | None = None) -> None:
        """`options`: redis-py connection options beyond the URL (`password`, `ssl_ca_certs`)."""
        parsed = urlparse(url)
        self.where = f"{parsed.scheme}://{parsed.hostname or parsed.path}" + (f":{parsed.port}" if parsed.port else "")
        self.prefix = prefix
        self.lease_ttl_ms = int(lease_ttl_s * 1000)
        # One immediate retry: a pooled connection may be stale after a Redis restart. No more:
        # a request must not wait on a Redis that is away (QuotaService then goes local at once).
        self._redis = aioredis.Redis.from_url(url, socket_timeout=socket_timeout_s,
                                              socket_connect_timeout=socket_timeout_s, retry=Retry(NoBackoff(), 1),
                                              **(options or {}))
        self._admit = self._redis.register_script(_ADMIT)
        self._tokens = self._redis.register_script(_TOKENS)
        self._renew = self._redis.register_script(_RENEW)

    def _key(self, key_id: str, what: str) -> str:
        return f"{self.prefix}:{{{key_id}}}:{what}"

    async def admit(self, key_id: str, limits: Limits, lease_id: str | None, *, count: bool) -> Refusal | None:
        interval = WINDOW_S * 1e6 / limits.rpm if count and limits.rpm else 0
        limit = limits.concurrency if lease_id else 0
        ok, reason, wait_us = await self._admit(
            keys=[self._key(key_id, "rpm"), self._key(key_id, "slots")],
            args=[repr(interval), limit, lease_id or "", self.lease_ttl_ms])
        if ok:
            return None
        return Refusal(reason.decode() if isinstance(reason, bytes) else str(reason), int(wait_us) / 1e6)

    async def release(self, key_id: str, lease_id: str) -> None:
        await self._redis.zrem(self._key(key_id, "slots"), lease_id)

    async def renew(self, leases: list[tuple[str, str]]) -> None:
        """Extend these (key id, lease id) leases by another TTL."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for key_id, lease_id in leases:
                await self._renew(keys=[self._key(key_id, "slots")], args=[lease_id, self.lease_ttl_ms], client=pipe)
            await pipe.execute()

    async def reserve_tokens(self, key_id: str, tpm: int, tokens: int) -> Refusal | None:
        wait_us = await self._tokens(keys=[self._key(key_id, "tpm")], args=[repr(WINDOW_S * 1e6 / tpm), tokens, "1"])
        return Refusal("tpm", int(wait_us) / 1e6) if int(wait_us) > 0 else None

    async def charge_tokens(self, key_id: str, tpm: int, tokens: int) -> None:
        await self._tokens(keys=[self._key(key_id, "tpm")], args=[repr(WINDOW_S * 1e6 / tpm), tokens, "0"])

    async def ping(self) -> None:
        await self._redis.ping()

    async def check(self) -> None:
        """PING once; raise RedisAccessError if Redis refuses us, STORE_ERRORS if it is away."""
        try:
            await self._redis.ping()
        except (AuthenticationError, NoPermissionError) as e:
            raise RedisAccessError(f"Redis at {self.where} refused the credentials: {e} (check the ACL user in "
                                   "--redis-url and SLUICE_REDIS_PASSWORD / --redis-password-file)") from None
        except RedisError as e:
            if _tls_failure(e):
                raise RedisAccessError(f"Redis at {self.where}: the TLS handshake failed: {e} (check "
                                       "--redis-ca-file)") from None
            raise

    async def close(self) -> None:
        await self._redis.aclose()


def _tls_failure(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLError) or "SSL" in str(seen) or "certificate" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
