"""Stored responses, for `previous_response_id`, `GET`, `DELETE` and `input_items`.

Sluice keeps them itself, so no worker needs a store of its own (vLLM keeps none by default): each
record holds the response object, its input items, and the whole conversation up to and including
its answer as chat messages, so a continuation loads one record and walks no chain. The store is
bounded in count, bytes and age (oldest first out); a record larger than an eighth of the byte
bound is not kept. A record is visible only to the key that created it (its public key id; ""
when the server has no keys): another key's id reads as not found. With `--redis-url` records are
also written to Redis (`sluice:resp:<id>`, with the same TTL) so that any gateway replica can
continue a conversation; Redis is then the truth (a delete through one replica holds on all), and
this replica's copy serves only while Redis cannot be reached.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

from redis.exceptions import RedisError

STORE_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
log = logging.getLogger("sluice.responses")


@dataclass
class Stored:
    id: str
    owner: str
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]
    root: str  # the first response of the conversation: its session, for routing
    worker: str | None = None
    created_s: float = field(default_factory=time.time)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Stored:
        return cls(**json.loads(raw))


def _same_owner(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


class ResponseStore:
    def __init__(self, max_count: int = 10_000, max_bytes: int = 256 * 2**20, ttl_s: float = 7 * 86400,
                 redis: Any = None) -> None:
        self.max_count, self.max_bytes, self.ttl_s = max_count, max_bytes, ttl_s
        self._local: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (JSON, expiry)
        self._bytes = 0
        self._redis = redis

    def __len__(self) -> int:
        return len(self._local)

    @property
    def bytes(self) -> int:
        return self._bytes

    async def put(self, rec: Stored) -> bool:
        raw = rec.to_json()
        if len(raw) > self.max_bytes // 8:
            log.warning("response %s is %d bytes, over the store's record bound; not stored", rec.id, len(raw))
            return False
        self._drop(rec.id)
        self._local[rec.id] = (raw, time.monotonic() + self.ttl_s)
        self._bytes += len(raw)
        while self._local and (len(self._local) > self.max_count or self._bytes > self.max_bytes):
            self._drop(next(iter(self._local)))
        if self._redis is not None:
            try:
                await self._redis.set(f"sluice:resp:{rec.id}", raw, ex=max(1, int(self.ttl_s)))
            except STORE_ERRORS as e:
                log.warning("responses: cannot share %s through Redis (%s); only this replica has it", rec.id,
                            type(e).__name__)
        return True

    async def get(self, rid: str, owner: str) -> Stored | None:
        """With Redis, Redis is the truth (a record deleted through another replica is gone here too);
        this replica's copy serves only while Redis cannot be read."""
        raw = self._fresh(rid)
        if self._redis is not None:
            try:
                value = await self._redis.get(f"sluice:resp:{rid}")
                if value is None:
                    self._drop(rid)
                raw = value.decode("utf-8") if isinstance(value, bytes) else value
            except STORE_ERRORS as e:
                log.warning("responses: cannot read %s from Redis (%s); using this replica's copy", rid,
                            type(e).__name__)
        if raw is None:
            return None
        rec = Stored.from_json(raw)
        return rec if _same_owner(rec.owner, owner) else None

    async def delete(self, rid: str, owner: str) -> bool:
        rec = await self.get(rid, owner)
        if rec is None:
            return False
        self._drop(rid)
        if self._redis is not None:
            try:
                await self._redis.delete(f"sluice:resp:{rid}")
            except STORE_ERRORS as e:
                log.warning("responses: cannot delete %s in Redis (%s)", rid, type(e).__name__)
        return True

    def _fresh(self, rid: str) -> str | None:
        entry = self._local.get(rid)
        if entry is None:
            return None
        if entry[1] < time.monotonic():
            self._drop(rid)
            return None
        return entry[0]

    def _drop(self, rid: str) -> None:
        entry = self._local.pop(rid, None)
        if entry is not None:
            self._bytes -= len(entry[0])
