"""STAND-IN for vLLM's KV-event publisher (`ZmqEventPublisher`), on real ZMQ sockets.

A stand-in because tests must lose chosen messages, empty the replay buffer, restart
the sequence and send malformed batches on demand, which a real vLLM cannot be told to
do; tests/integration/vllm_pair/test_vllm_kv_replay.py checks replay against a real one.
It speaks vLLM's wire protocol: multipart [topic, seq (8 bytes big-endian), msgpack
EventBatch] on PUB, and a ROUTER replay socket answering [b"", start_seq] with one reply
per batch and then an end marker with seq -1: [b"", topic, seq, payload] as vLLM 0.32
sends them, or [b"", seq, payload] as older releases did. It is an XPUB so a test can
wait for the subscription instead of sleeping (PUB drops messages sent before a
subscriber joined).
"""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio


class VllmPublisherStandIn:
    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, *, bind: bool, topic: bytes = b"kv",
                 replay_with_topic: bool = True, replay_endpoint: str = "tcp://127.0.0.1:*") -> None:
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, also a resubscribing subscriber's
        if bind:
            self.pub.bind(endpoint)
            self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self.pub.connect(endpoint)
            self.endpoint = endpoint
        self.replay = ctx.socket(zmq.ROUTER)
        self.replay.setsockopt(zmq.LINGER, 0)
        self.replay.bind(replay_endpoint)
        self.replay_endpoint = self.replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self.topic = topic
        self._reply_head = [b"", topic] if replay_with_topic else [b""]
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self._task = asyncio.create_task(self._serve_replay())

    async def wait_subscribed(self) -> None:
        """Until a subscriber joins (XPUB delivers b"\x01" + topic; b"\x00" + topic when one leaves)."""
        while True:
            msg = await asyncio.wait_for(self.pub.recv(), 10)
            if msg[:1] == b"\x01":
                return

    async def publish(self, seq: int, payload: bytes, *, drop: bool = False) -> None:
        """Record `seq` for replay; `drop` simulates a message lost on the wire."""
        self.buffer.append((seq, payload))
        if not drop:
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    async def send_raw(self, frames: list[bytes]) -> None:
        """Send any multipart message, e.g. one that is not [topic, seq, payload]."""
        await self.pub.send_multipart(frames)

    async def _serve_replay(self) -> None:
        while True:
            client, _, start = await self.replay.recv_multipart()
            start_seq = int.from_bytes(start, "big")
            self.replay_requests.append(start_seq)
            for seq, payload in self.buffer:
                if seq >= start_seq:
                    await self.replay.send_multipart([client, *self._reply_head, seq.to_bytes(8, "big"), payload])
            end = (-1).to_bytes(8, "big", signed=True)
            await self.replay.send_multipart([client, *[b""] * len(self._reply_head), end, b""])

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.pub.close(0)
        self.replay.close(0)
