"""Routing state shared between gateway replicas through Redis.

Local first: each replica routes on its own in-memory index and load and
never waits on Redis. This module spreads changes in the background:

* ``{prefix}:ops`` -- a stream of index operations (store, remove, clear),
  each tagged with the replica that made it; every replica tails it and
  applies the others' operations;
* ``{prefix}:blocks:{worker}`` -- a sorted set per worker, hash -> expiry
  (wall-clock seconds, ``+inf`` for exact entries): the snapshot a replica
  loads when it (re)connects, since the stream is trimmed;
* ``{prefix}:load:{replica}`` -- a hash worker -> "in_flight queued_tokens"
  with a short TTL, and ``{prefix}:replicas``, a sorted set of heartbeats, so
  replicas add each other's in-flight load and a dead replica's load expires.

When Redis goes away, operations queue in a bounded outbox and routing goes
on with the local view. When it returns (possibly empty, after a restart),
the replica flushes its outbox, pushes its local entries (exact ones only for
workers whose events it ingests itself, so it never resurrects entries another
replica has since removed) and reloads the snapshots.

The class runs on one event loop; `publish_*` are synchronous and never block.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgpack
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry
from redis.typing import EncodableT

from router.config import RedisStateConfig
from router.shared import ReplicaSink

log = logging.getLogger(__name__)
_STORE, _REMOVE, _CLEAR = "s", "r", "c"
# (kind, worker, router hashes, ttl_s for a store / exact_only for a clear)
_Op = tuple[str, str, list[int], Any]


class RedisSharedState:
    """A :class:`router.shared.SharedState` backed by Redis."""

    backend = "redis"

    def __init__(self, config: RedisStateConfig) -> None:
        self.config = config
        self.connected = False
        self.resyncs = 0
        self._outbox: deque[_Op] = deque()
        self._outbox_overflowed = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_id = "0-0"
        extra: dict[str, Any] = {k: v for k, v in (("password", config.password),
                                                   ("ssl_ca_certs", config.ssl_ca_certs)) if v}
        self._redis = aioredis.Redis.from_url(
            config.url, socket_timeout=config.socket_timeout_s,
            socket_connect_timeout=config.socket_timeout_s, retry=Retry(NoBackoff(), 0), **extra)

    # -- SharedState -------------------------------------------------------------
    def publish_store(self, worker: str, hashes: Sequence[int], ttl_s: float | None) -> None:
        self._queue((_STORE, worker, list(hashes), ttl_s))

    def publish_remove(self, worker: str, hashes: Sequence[int]) -> None:
        self._queue((_REMOVE, worker, list(hashes), None))

    def publish_clear(self, worker: str, exact_only: bool) -> None:
        self._queue((_CLEAR, worker, [], exact_only))

    async def start(self, sink: ReplicaSink) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._supervise(sink), name="redis-shared-state")

    async def stop(self) -> None:
        """Stop syncing; bounded in time even if a Redis call is stuck."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=self.config.socket_timeout_s * 2)
        self.connected = False
        with contextlib.suppress(RedisError, OSError, asyncio.TimeoutError):
            await asyncio.wait_for(self._redis.aclose(), timeout=self.config.socket_timeout_s * 2)

    # -- internals ---------------------------------------------------------------
    def _queue(self, op: _Op) -> None:
        if len(self._outbox) >= self.config.max_outbox:
            # The resync push after an outage re-sends stores; dropped removals
            # age out through LRU and TTL. Losing the oldest is the bounded choice.
            self._outbox.popleft()
            if not self._outbox_overflowed:
                log.warning("shared routing state: outbox full (%d ops); dropping the oldest", len(self._outbox))
                self._outbox_overflowed = True
        self._outbox.append(op)
        self._wake.set()

    def _key(self, *parts: str) -> str:
        return ":".join((self.config.prefix, *parts))

    async def _supervise(self, sink: ReplicaSink) -> None:
        delay = self.config.reconnect_min_s
        while True:
            try:
                await self._resync(sink)
                self.connected = True
                delay = self.config.reconnect_min_s
                await self._run_session(sink)
            except (RedisError, OSError) as e:
                if self.connected:
                    log.warning("shared routing state: lost Redis (%s); routing on the local view", e)
            except Exception:
                # A reply we cannot parse (a proxy, a wrong server) must not end sharing
                # for good: drop the connection and start over like any other failure.
                log.exception("shared routing state: unexpected error; reconnecting")
                sink.record_task_restart("redis-sync")
                with contextlib.suppress(Exception):
                    await self._redis.connection_pool.disconnect()
            self.connected = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.reconnect_max_s)

    async def _run_session(self, sink: ReplicaSink) -> None:
        """Read, write and exchange load until one of them fails; re-raise that failure."""
        tasks = [asyncio.create_task(c) for c in (self._reader(sink), self._writer(), self._load_loop(sink))]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                t.result()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _resync(self, sink: ReplicaSink) -> None:
        """Flush what queued while away, push the local view, load everyone else's."""
        last = await self._redis.xrevrange(self._key("ops"), count=1)
        await self._flush()
        now = time.time()
        owned = sink.event_workers()
        pipe = self._redis.pipeline(transaction=False)
        for worker in sink.worker_names():
            entries: dict[str, float] = {}
            for h, ttl_s in sink.local_entries(worker):
                if ttl_s is None and worker not in owned:
                    continue
                entries[str(h)] = math.inf if ttl_s is None else now + ttl_s
            if entries:
                pipe.zadd(self._key("blocks", worker), entries, gt=True)
        await pipe.execute()
        for worker in sink.worker_names():
            rows = _scored(await self._redis.zrangebyscore(self._key("blocks", worker), now, "+inf",
                                                           withscores=True))
            exact = [h for h, score in rows if math.isinf(score)]
            if exact:
                sink.apply_remote_store(worker, exact, None)
            for h, score in rows:
                if not math.isinf(score):
                    sink.apply_remote_store(worker, [h], score - now)
        self._last_id = _text(last[0][0]) if last else "0-0"
        self.resyncs += 1

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._flush()
            await asyncio.sleep(self.config.flush_interval_s)  # batch bursts into one round trip

    async def _flush(self) -> None:
        if not self._outbox:
            return
        ops = list(self._outbox)
        now = time.time()
        pipe = self._redis.pipeline(transaction=False)
        for kind, worker, hashes, arg in ops:
            key = self._key("blocks", worker)
            payload = msgpack.packb([kind, worker, hashes, arg])
            pipe.xadd(self._key("ops"), {"r": self.config.replica_id, "op": payload},
                      maxlen=self.config.stream_maxlen, approximate=True)
            if kind == _STORE:
                score = math.inf if arg is None else now + arg
                pipe.zadd(key, {str(h): score for h in hashes}, gt=True)
            elif kind == _REMOVE and hashes:
                pipe.zrem(key, *[str(h) for h in hashes])
            elif kind == _CLEAR:
                if arg:
                    pipe.zremrangebyscore(key, "+inf", "+inf")
                else:
                    pipe.delete(key)
        await pipe.execute()
        # Only drop what was written: ops queued during the await stay queued.
        for _ in ops:
            self._outbox.popleft()
        self._outbox_overflowed = False

    async def _reader(self, sink: ReplicaSink) -> None:
        me = self.config.replica_id.encode()
        while True:
            resp = await self._redis.xread({self._key("ops"): self._last_id}, count=1000,
                                           block=self.config.read_block_ms)
            for entry_id, entry in _stream_entries(resp):
                self._last_id = entry_id
                if entry.get(b"r") != me:
                    _apply(sink, msgpack.unpackb(entry[b"op"]))

    async def _load_loop(self, sink: ReplicaSink) -> None:
        while True:
            await self._exchange_load(sink)
            await self._trim(sink)
            await asyncio.sleep(self.config.load_interval_s)

    async def _exchange_load(self, sink: ReplicaSink) -> None:
        cfg, now = self.config, time.time()
        mine = self._key("load", cfg.replica_id)
        pipe = self._redis.pipeline(transaction=False)
        loads: dict[EncodableT, EncodableT] = {w: f"{i} {q}" for w, (i, q) in sink.local_loads().items()}
        pipe.delete(mine)
        if loads:
            pipe.hset(mine, mapping=loads)
            pipe.pexpire(mine, int(cfg.load_ttl_s * 1000))
        pipe.zadd(self._key("replicas"), {cfg.replica_id: now})
        pipe.zremrangebyscore(self._key("replicas"), "-inf", now - cfg.load_ttl_s)
        pipe.zrangebyscore(self._key("replicas"), now - cfg.load_ttl_s, "+inf")
        replicas = (await pipe.execute())[-1]
        others = [r for r in map(_text, replicas) if r != cfg.replica_id]
        totals: dict[str, list[int]] = {w: [0, 0] for w in sink.worker_names()}
        if others:
            pipe = self._redis.pipeline(transaction=False)
            for r in others:
                pipe.hgetall(self._key("load", r))
            for replica_loads in await pipe.execute():
                for w, v in replica_loads.items():
                    t = totals.get(_text(w))
                    if t is not None:
                        i, q = v.split()
                        t[0] += int(i)
                        t[1] += int(q)
        for w, (i, q) in totals.items():
            sink.set_remote_load(w, i, q)

    async def _trim(self, sink: ReplicaSink) -> None:
        now, cap = time.time(), self.config.max_blocks_per_worker
        pipe = self._redis.pipeline(transaction=False)
        for w in sink.worker_names():
            key = self._key("blocks", w)
            pipe.zremrangebyscore(key, "-inf", now)
            # Beyond the cap, drop the entries that expire soonest; exact (+inf) go last.
            pipe.zremrangebyrank(key, 0, -cap - 1)
        await pipe.execute()


# Replies are decoded here, at the boundary: a malformed one raises, and the
# supervisor drops the connection and starts over.
def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _scored(rows: Any) -> list[tuple[int, float]]:
    """(hash, score) pairs of a ZRANGEBYSCORE ... WITHSCORES reply."""
    return [(int(member), float(score)) for member, score in rows]


def _stream_entries(resp: Any) -> list[tuple[str, dict[bytes, bytes]]]:
    """(entry id, fields) of every entry in an XREAD reply (None when the block timed out)."""
    return [(_text(entry_id), dict(fields)) for _stream, entries in resp or [] for entry_id, fields in entries]


def _apply(sink: ReplicaSink, op: Any) -> None:
    kind, worker, hashes, arg = op
    if kind == _STORE:
        sink.apply_remote_store(worker, hashes, arg)
    elif kind == _REMOVE:
        sink.apply_remote_remove(worker, hashes)
    elif kind == _CLEAR:
        sink.apply_remote_clear(worker, bool(arg))


# RedisStateConfig is defined in router.config; it is re-exported so that a backend and its config import together.
__all__ = ["RedisSharedState", "RedisStateConfig"]
