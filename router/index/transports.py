"""KV-event transports: vLLM's ZMQ publisher and TRT-LLM's `/kv_cache_events`.

Thin async drivers. Decoding and index updates live in `router.index.events`; these
classes only move bytes, keep sequence numbers straight and count.

vLLM (``--kv-events-config``) sends multipart ``[topic, seq, payload]`` on a
PUB socket: ``seq`` is an 8-byte big-endian counter starting at 0, ``payload``
a msgpack EventBatch. The PUB side binds when its endpoint has a ``*`` (then
we connect) and connects otherwise (then we must bind). Missed batches can be
asked for on the replay ROUTER socket: send ``[b"", start_seq]`` from a DEALER
and read replies until ``seq == -1``. vLLM 0.32 replies ``[b"", topic, seq,
payload]``; older releases sent ``[b"", seq, payload]``; both are accepted.

TRT-LLM's ``trtllm-serve`` answers ``POST /kv_cache_events`` with the events
queued since the last call (a destructive drain) as a JSON list; ids are
consecutive, and there is no replay, so a gap means starting over.

Whenever continuity is lost the worker's exact index entries are dropped
(`on_reset(reason)`, one of `router.telemetry.metrics.KV_RESET_REASONS`): a gap replay could not fill
(``gap``), a sequence that went back (``restart``: the engine started over with
an empty cache), a message that cannot be decoded (``malformed``: whatever it
said is lost), or a failure while applying one (``error``). Routing for that
worker then rests on speculative entries until new events arrive. Nothing a
publisher sends ends a subscriber.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import zmq
import zmq.asyncio

from router.index.events import EventBatch, EventDecodeError, KVEvent, decode_trtllm_events, decode_vllm_batch

log = logging.getLogger(__name__)
_END_SEQ = -1


@dataclass(slots=True)
class SubscriberStats:
    batches: int = 0
    gaps: int = 0
    replays: int = 0  # gaps fully filled by replay
    replay_failures: int = 0  # gaps we could not fill: exact entries were dropped
    restarts: int = 0  # sequence went back: the engine restarted
    decode_errors: int = 0
    errors: int = 0  # batches whose handling raised (a bug): the index was reset, the subscriber went on
    last_seq: int | None = None


class ZmqEventSubscriber:
    """Receives one worker's vLLM event batches in order.

    `on_batch(batch)` is called for every batch in sequence order (replayed
    ones included); `on_reset(reason)` when continuity is lost and the worker's
    exact index entries can no longer be trusted; `on_gap(filled)` after each
    sequence gap, with whether replay filled it. All run on the event loop
    that runs :meth:`run` and must not block.
    """

    def __init__(self, worker: str, endpoint: str, *, bind: bool, on_batch: Callable[[EventBatch], None],
                 on_reset: Callable[[str], None], on_gap: Callable[[bool], None] | None = None,
                 replay_endpoint: str | None = None, topic: str = "",
                 replay_timeout_s: float = 2.0, ctx: zmq.asyncio.Context | None = None) -> None:
        self.worker = worker
        self.stats = SubscriberStats()
        self._on_batch = on_batch
        self._on_reset = on_reset
        self._on_gap = on_gap or (lambda filled: None)
        self._replay_endpoint = replay_endpoint
        self._replay_timeout_ms = int(replay_timeout_s * 1000)
        self._ctx = ctx or zmq.asyncio.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sub.setsockopt(zmq.LINGER, 0)
        if bind:
            self._sub.bind(endpoint)
        else:
            self._sub.connect(endpoint)
        # With "tcp://127.0.0.1:*" the OS picked the port; tell the caller which.
        self.endpoint: str = self._sub.getsockopt_string(zmq.LAST_ENDPOINT) if bind else endpoint

    @property
    def closed(self) -> bool:
        return bool(self._sub.closed)

    async def run(self) -> None:
        """Receive until cancelled. Never raises for what a publisher sends; closes the socket on exit."""
        try:
            while True:
                frames = await self._recv()
                try:
                    await self._handle(frames)
                except Exception:
                    # Whatever the batch said is lost: the index cannot be trusted past it.
                    self.stats.errors += 1
                    log.exception("kv events from %s: applying a message failed; resetting its index", self.worker)
                    self._on_reset("error")
        finally:
            self.close()

    async def _recv(self) -> list[bytes]:
        try:
            return await self._sub.recv_multipart()
        except asyncio.CancelledError:
            # pyzmq cancels a pending receive when its socket is closed; unless this task
            # itself is being cancelled, that is a failure to report, not a stop.
            task = asyncio.current_task()
            if self._sub.closed and task is not None and not task.cancelling():
                raise ConnectionError(f"the kv-event socket of {self.worker} was closed") from None
            raise

    def close(self) -> None:
        """Close the socket (idempotent); needed when `run` was cancelled before it started."""
        if not self._sub.closed:
            self._sub.close(linger=0)

    async def _handle(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self.stats.decode_errors += 1
            log.warning("kv events from %s: a message of %d frame(s) is not [topic, seq, payload]; resetting "
                        "its index", self.worker, len(frames))
            self._on_reset("malformed")
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        last = self.stats.last_seq
        if last is not None and seq == last and seq != 0:
            return  # a duplicate
        if last is not None and seq <= last:
            # Nothing resends an older batch: the engine restarted with an empty cache and
            # its count started over. Its first batches may have been missed (a subscriber
            # reconnecting after the restart); replay can bring them.
            self.stats.restarts += 1
            log.warning("kv events from %s: sequence went back from %d to %d (engine restart); resetting its "
                        "index", self.worker, last, seq)
            self._on_reset("restart")
            if seq > 0:
                await self._fill_gap(0, seq)
        elif last is not None and seq > last + 1:
            await self._fill_gap(last + 1, seq)
        self._deliver(seq, frames[2])

    async def _fill_gap(self, start: int, stop: int) -> None:
        self.stats.gaps += 1
        filled = await self._replay(start, stop)
        if filled:
            self.stats.replays += 1
        else:
            self.stats.replay_failures += 1
            log.warning("kv events from %s: batches %d..%d are lost; resetting its index", self.worker, start,
                        stop - 1)
            self._on_reset("gap")
        self._on_gap(filled)

    def _deliver(self, seq: int, payload: bytes) -> None:
        self.stats.last_seq = seq
        try:
            batch = decode_vllm_batch(payload)
        except EventDecodeError as e:
            self.stats.decode_errors += 1
            log.warning("kv events from %s: undecodable batch %d (%s); resetting its index", self.worker, seq, e)
            self._on_reset("malformed")
            return
        self.stats.batches += 1
        self._on_batch(batch)

    async def _replay(self, start: int, stop: int) -> bool:
        """Ask for batches [start, stop) and deliver them; True if none is missing."""
        if self._replay_endpoint is None:
            return False
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        # A fresh socket per replay: a late answer to a timed-out request can never
        # be mistaken for the answer to the next one.
        try:
            dealer.connect(self._replay_endpoint)
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            expected = start
            while True:
                if not await dealer.poll(self._replay_timeout_ms):
                    return False
                reply = _replay_reply(await dealer.recv_multipart())
                if reply is None:
                    return False
                seq, payload = reply
                if seq == _END_SEQ:
                    return expected >= stop
                if seq < expected or seq >= stop:
                    continue  # older than asked, or the live stream will bring it
                if seq > expected:
                    return False  # the engine's replay buffer no longer has what we need
                self._deliver(seq, payload)
                expected = seq + 1
        finally:
            dealer.close(linger=0)


def _replay_reply(frames: list[bytes]) -> tuple[int, bytes] | None:
    """(seq, payload) of one replay reply as a DEALER reads it; None if it is not one."""
    if len(frames) == 4 and not frames[0]:  # [b"", topic, seq, payload]
        frames = [frames[0], frames[2], frames[3]]
    if len(frames) != 3 or frames[0] or len(frames[1]) != 8:
        return None
    return int.from_bytes(frames[1], "big", signed=True), frames[2]


TrtllmItem = tuple[int, KVEvent | int | None]


class TrtllmEventPoller:
    """Drains one TRT-LLM worker's `/kv_cache_events` every `interval_s`.

    `on_items(items)` receives decoded (event_id, item) pairs in order;
    `on_reset("gap")` and `on_gap(False)` are called after an event-id gap
    (TRT-LLM has no replay), `on_reset("restart")` when ids start over and
    `on_reset("malformed")` when a drained body cannot be decoded.
    """

    closed = False  # no socket: a restarted task reuses the poller

    def __init__(self, worker: str, base_url: str, client: httpx.AsyncClient, *, interval_s: float,
                 timeout_s: float, on_items: Callable[[list[TrtllmItem]], None],
                 on_reset: Callable[[str], None], on_gap: Callable[[bool], None] | None = None) -> None:
        self.worker = worker
        self.stats = SubscriberStats()
        self._url = base_url.rstrip("/") + "/kv_cache_events"
        self._client = client
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._on_items = on_items
        self._on_reset = on_reset
        self._on_gap = on_gap or (lambda filled: None)
        self._method = "POST"  # trtllm-serve registers POST; some builds answer GET only

    async def poll_once(self) -> int:
        """One drain; returns how many events arrived. Raises httpx.HTTPError, EventDecodeError."""
        resp = await self._client.request(self._method, self._url, timeout=self._timeout_s)
        if resp.status_code == 405:
            self._method = "GET" if self._method == "POST" else "POST"
            resp = await self._client.request(self._method, self._url, timeout=self._timeout_s)
        resp.raise_for_status()
        items = decode_trtllm_events(resp.json())
        if not items:
            return 0
        last = self.stats.last_seq
        first = items[0][0]
        if last is not None and first > last + 1:
            self.stats.gaps += 1
            self.stats.replay_failures += 1
            self._on_reset("gap")
            self._on_gap(False)
        elif last is not None and first <= last and first == 0:
            self.stats.restarts += 1
            self._on_reset("restart")
        self.stats.last_seq = items[-1][0]
        self.stats.batches += 1
        self._on_items(items)
        return len(items)

    async def run(self) -> None:
        """Poll until cancelled; I/O and decode errors are logged and retried next interval."""
        while True:
            try:
                await self.poll_once()
            except httpx.HTTPError as e:  # the worker is down or busy: nothing was drained
                log.debug("kv events from %s: %s", self.worker, e)
            except (EventDecodeError, ValueError) as e:
                # The drain happened but its events are unreadable: they are lost.
                self.stats.decode_errors += 1
                log.warning("kv events from %s: undecodable drain (%s); resetting its index", self.worker, e)
                self._on_reset("malformed")
            await asyncio.sleep(self._interval_s)
