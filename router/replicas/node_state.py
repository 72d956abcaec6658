"""Routing state shared by the frontends of one `sluice serve --frontends N`, on one node, without Redis.

Each frontend routes on its own index and load, never waiting on a sibling, as a gateway replica
does with Redis (`router.shared`). What the siblings must agree on travels between them over Unix
sockets in the supervisor's private directory (mode 0700): frontend i listens on
`routing-<i>.sock`, and every other frontend keeps one connection to it and writes frames
(a 4-byte big-endian length, then a msgpack map) at most every `interval_s`:

* `ops`: the speculative index entries its dispatches added (worker, router hashes, ttl), so that
  a conversation's next turn finds its worker whichever frontend takes it before the worker's KV
  events arrive, and for workers without events at all. Exact entries do not travel: every
  frontend subscribes to every worker's KV events itself and applies them.
* `loads`: its requests in flight and queued prefill tokens per worker, when they changed and at
  least every `heartbeat_s` (the heartbeat). Each frontend adds its siblings' up
  (`ReplicaSink.set_remote_load`), so load placed by one steers the others' choices.
* `learn`, every `learn_interval_s`: the statistics its cost learned from its own observations
  (`router.learning.CostLearner.export`); each frontend fits the fleet's coefficients, the speed
  factors and the answer lengths over all of them (`set_remote_learning`).

A request costs one deque append here (`publish_store`); everything else is the periodic tick.
A sibling not heard from for `ttl_s` (dead, or being restarted) no longer counts: its load and
learning are dropped and logged, and it is reconnected to on each heartbeat until it answers. One
that stops reading is cut off once `max_buffered_bytes` wait for it (frames are never awaited,
so it never delays the others') and reconnected the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from router.shared import ReplicaSink

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeStateConfig:
    directory: Path  # the supervisor's private directory (gateway.frontends.supervisor)
    index: int  # this frontend's
    count: int  # frontends in all
    interval_s: float = 0.05  # frames carry what changed, at most this often
    heartbeat_s: float = 0.5  # ... and the load at least this often, changed or not
    learn_interval_s: float = 1.0
    ttl_s: float = 2.0  # a sibling silent this long no longer counts
    max_outbox: int = 100_000  # speculative stores waiting for the next frame; the oldest go first
    max_frame_bytes: int = 64 * 1024 * 1024
    # Bytes waiting for a sibling that stopped reading (on top of the kernel's buffer): past this
    # it is cut off and reconnected on a heartbeat. Frames are never awaited, so one sibling that
    # stalls never delays the others'.
    max_buffered_bytes: int = 8 * 1024 * 1024

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"frontend index {self.index} outside 0..{self.count - 1}")
        if not 0 < self.interval_s <= self.heartbeat_s < self.ttl_s:
            raise ValueError("need 0 < interval_s <= heartbeat_s < ttl_s")


class NodeSharedState:
    """A :class:`router.shared.SharedState` between the frontends of one server; one event loop."""

    backend = "node"

    def __init__(self, config: NodeStateConfig) -> None:
        self.config = config
        self._siblings = [i for i in range(config.count) if i != config.index]
        self._outbox: deque[tuple[str, list[int], float]] = deque(maxlen=config.max_outbox)
        self._sink: ReplicaSink | None = None
        self._server: asyncio.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._inbound: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}  # siblings' connections to this one
        self._heard: dict[int, float] = {}  # sibling -> when its last frame arrived
        self._loads: dict[int, dict[str, tuple[int, int]]] = {}
        self._learned: dict[int, Mapping[str, Any]] = {}
        self._sent_loads: dict[str, tuple[int, int]] | None = None
        self._loads_at = self._learn_at = -math.inf
        self._retry_at: dict[int, float] = {}

    @property
    def connected(self) -> bool:
        """True while every sibling has been heard from within `ttl_s`."""
        now = time.monotonic()
        return all(now - self._heard.get(i, -math.inf) <= self.config.ttl_s for i in self._siblings)

    def _path(self, index: int) -> Path:
        return self.config.directory / f"routing-{index}.sock"

    # -- SharedState -------------------------------------------------------------
    def publish_store(self, worker: str, hashes: Sequence[int], ttl_s: float | None) -> None:
        if ttl_s is not None and hashes and self._siblings:  # exact ones: each sibling has the events
            self._outbox.append((worker, list(hashes), ttl_s))

    def publish_remove(self, worker: str, hashes: Sequence[int]) -> None:
        """Removals come from KV events, which every sibling applies itself."""

    def publish_clear(self, worker: str, exact_only: bool) -> None:
        """Likewise (a sibling that lost a worker's events resets its own entries)."""

    async def start(self, sink: ReplicaSink) -> None:
        if self._task is not None:
            return
        self._sink = sink
        path = self._path(self.config.index)
        path.unlink(missing_ok=True)  # left by this frontend's previous process
        self._server = await asyncio.start_unix_server(self._receive, path=str(path))
        os.chmod(path, 0o600)
        self._task = asyncio.create_task(self._run(sink), name="node-shared-state")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for writer in (*self._writers.values(), *self._inbound.values()):
            writer.close()  # a reader then ends at EOF, as when a sibling goes away
        self._writers.clear()
        if self._inbound:
            await asyncio.wait(list(self._inbound), timeout=1.0)
        if self._server is not None:
            self._server.close()
            self._path(self.config.index).unlink(missing_ok=True)
            self._server = None

    # -- sending -----------------------------------------------------------------
    async def _run(self, sink: ReplicaSink) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            try:
                await self._tick(sink, time.monotonic())
            except Exception:  # a bug must not end sharing for good: log it and go on next tick
                log.exception("sharing routing state with the sibling frontends failed; retrying")
                sink.record_task_restart("node-sync")

    async def _tick(self, sink: ReplicaSink, now: float) -> None:
        self._expire(sink, now)
        frame = self._frame(sink, now)
        if frame is None:
            return
        data = msgpack.packb(frame)
        payload = len(data).to_bytes(4, "big") + data
        await asyncio.gather(*(self._send(i, payload, now) for i in self._siblings))

    def _frame(self, sink: ReplicaSink, now: float) -> dict[str, Any] | None:
        cfg = self.config
        ops = list(self._outbox)
        self._outbox.clear()
        loads = sink.local_loads()
        send_loads = loads != self._sent_loads or now - self._loads_at >= cfg.heartbeat_s
        if send_loads:
            self._sent_loads, self._loads_at = loads, now
        learn = None
        if now - self._learn_at >= cfg.learn_interval_s:
            learn, self._learn_at = sink.local_learning(), now
        if not ops and not send_loads and learn is None:
            return None
        return {"i": cfg.index, "ops": ops, "loads": loads if send_loads else None, "learn": learn}

    async def _send(self, index: int, payload: bytes, now: float) -> None:
        writer = self._writers.get(index)
        if writer is None:
            if now < self._retry_at.get(index, -math.inf):
                return
            self._retry_at[index] = now + self.config.heartbeat_s
            try:
                async with asyncio.timeout(self.config.heartbeat_s):
                    _, writer = await asyncio.open_unix_connection(str(self._path(index)))
            except (OSError, TimeoutError):
                return  # not listening yet (starting, or being restarted): the next heartbeat tries again
            self._writers[index] = writer
            self._loads_at = self._learn_at = -math.inf  # it gets everything on the next tick
        try:
            writer.write(payload)
            buffered = writer.transport.get_write_buffer_size()
            if buffered > self.config.max_buffered_bytes:
                raise OSError(f"{buffered} bytes unread")
        except OSError as e:
            log.warning("frontend %d stopped taking the routing state (%s); reconnecting", index,
                        e or type(e).__name__)
            self._writers.pop(index, None)
            writer.transport.abort()  # close() would wait to flush what it will not read

    # -- receiving ---------------------------------------------------------------
    async def _receive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._inbound[task] = writer
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big")
                if size > self.config.max_frame_bytes:
                    raise ValueError(f"a frame of {size} bytes")
                self._apply(msgpack.unpackb(await reader.readexactly(size)), time.monotonic())
        except (asyncio.IncompleteReadError, OSError):
            pass  # the sibling went away; its silence expires what it sent
        except Exception as e:  # a frame that cannot be read: drop the connection, the sibling reconnects
            log.warning("a sibling frontend sent routing state that could not be read: %s", e)
        finally:
            writer.close()
            if task is not None:
                self._inbound.pop(task, None)

    def _apply(self, frame: Mapping[str, Any], now: float) -> None:
        sink = self._sink
        index = int(frame["i"])
        if sink is None or index not in self._siblings:
            raise ValueError(f"a frame from frontend {index}")
        self._heard[index] = now
        for worker, hashes, ttl_s in frame["ops"]:
            sink.apply_remote_store(str(worker), [int(h) for h in hashes], float(ttl_s))
        if frame["loads"] is not None:
            self._loads[index] = {str(w): (int(n), int(q)) for w, (n, q) in frame["loads"].items()}
            self._push_loads(sink)
        if frame["learn"] is not None:
            self._learned[index] = frame["learn"]
            self._push_learning(sink, index)

    def _push_loads(self, sink: ReplicaSink) -> None:
        for worker in sink.worker_names():
            parts = [loads.get(worker, (0, 0)) for loads in self._loads.values()]
            sink.set_remote_load(worker, sum(p[0] for p in parts), sum(p[1] for p in parts))

    def _push_learning(self, sink: ReplicaSink, index: int | None) -> None:
        try:
            sink.set_remote_learning(list(self._learned.values()))
        except (ValueError, TypeError, KeyError) as e:
            log.warning("frontend %s sent cost statistics that could not be read (%s); left out", index, e)
            if index is not None:
                self._learned.pop(index, None)
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    sink.set_remote_learning(list(self._learned.values()))

    def _expire(self, sink: ReplicaSink, now: float) -> None:
        silent = [i for i, at in self._heard.items() if now - at > self.config.ttl_s]
        for index in silent:
            log.warning("frontend %d silent for %.1f s: its load and what it learned no longer count", index,
                        now - self._heard.pop(index))
            self._loads.pop(index, None)
            self._learned.pop(index, None)
        if silent:
            self._push_loads(sink)
            self._push_learning(sink, None)
