"""Per-worker load: what the gateway has in flight plus what the worker reports.

Two sources, merged into one :class:`LoadSnapshot` per worker:

* the gateway's own bookkeeping (exact and instant): requests in flight, and
  prefill tokens queued (dispatched, no first token yet), fed by the router's
  dispatch / first-token / finish hooks; other gateway replicas' counts arrive
  through Redis (`set_remote`);
* the worker's Prometheus `/metrics` (covers traffic from elsewhere, but is as
  old as the scrape interval): running and waiting requests, KV-cache usage,
  and the cache config (block size, number of blocks).

`LoadTracker` and `parse_vllm_metrics` are pure; `scrape_metrics` is the thin
async I/O step. Not thread-safe: one event loop owns a tracker.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from router.telemetry import exposition


@dataclass(frozen=True, slots=True)
class ScrapedMetrics:
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None  # fraction 0..1
    block_size: int | None = None
    num_gpu_blocks: int | None = None


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    in_flight: int = 0  # this replica + others (via Redis)
    queued_prefill_tokens: int = 0  # uncached prompt tokens still waiting for their first token
    running: int | None = None  # scraped; None when unknown or stale
    waiting: int | None = None
    kv_usage: float | None = None
    # Attention query-key pairs of that queued prefill (this replica's only: Redis shares tokens):
    # a long prompt's prefill costs more than its token count says.
    queued_prefill_pairs: int = 0
    # Every prefill this replica has sent the worker since it was added (tokens, pairs): among
    # workers the cost cannot tell apart, the one that has done the least gets the request.
    assigned_prefill_tokens: int = 0
    assigned_prefill_pairs: int = 0

    @property
    def requests(self) -> int:
        """Best estimate of concurrent requests on the worker."""
        scraped = (self.running or 0) + (self.waiting or 0)
        return max(self.in_flight, scraped)


@dataclass(slots=True)
class _Req:
    worker: str
    prefill_tokens: int  # still to compute, as far as the router knows
    prefill_pairs: int
    first_token: bool = False
    pending: tuple[int, ...] = ()  # router hashes of the blocks its prefill computes (see `expect`)
    block_size: int = 0


class LoadTracker:
    """Gateway-side load bookkeeping; every method is O(1) and never raises on unknown ids.

    `snapshot` is read for every worker on every ranking, so a worker's snapshot is
    kept until its load changes or its scrape goes stale.
    """

    def __init__(self, stale_after_s: float) -> None:
        self._stale_after_s = stale_after_s
        self._reqs: dict[str, _Req] = {}
        self._in_flight: dict[str, int] = {}
        self._queued: dict[str, int] = {}
        self._pairs: dict[str, int] = {}
        self._scraped: dict[str, tuple[float, ScrapedMetrics]] = {}
        self._remote: dict[str, tuple[int, int]] = {}
        self._snapshots: dict[str, tuple[float, LoadSnapshot]] = {}  # worker -> (valid until, snapshot)
        # worker -> {router hash of a block a queued prefill will compute: (request id, chain position)}
        self._pending: dict[str, dict[int, tuple[str, int]]] = {}
        self._assigned: dict[str, tuple[int, int]] = {}

    def dispatch(self, worker: str, request_id: str, prefill_tokens: int, prefill_pairs: int = 0) -> None:
        """A request was sent to `worker`; `prefill_tokens` is its predicted uncached prompt and
        `prefill_pairs` that prefill's attention query-key pairs."""
        if request_id in self._reqs:
            self.finish(request_id)  # a retry re-dispatches the same id
        r = _Req(worker, max(0, prefill_tokens), max(0, prefill_pairs))
        self._reqs[request_id] = r
        self._in_flight[worker] = self._in_flight.get(worker, 0) + 1
        self._queued[worker] = self._queued.get(worker, 0) + r.prefill_tokens
        self._pairs[worker] = self._pairs.get(worker, 0) + r.prefill_pairs
        tokens, pairs = self._assigned.get(worker, (0, 0))
        self._assigned[worker] = (tokens + r.prefill_tokens, pairs + r.prefill_pairs)
        self._snapshots.pop(worker, None)

    def first_token(self, request_id: str) -> None:
        r = self._reqs.get(request_id)
        if r is None or r.first_token:
            return
        r.first_token = True
        self._unqueue(r)

    def finish(self, request_id: str) -> str | None:
        """Release the request; returns the worker it was on (None if unknown)."""
        r = self._reqs.pop(request_id, None)
        if r is None:
            return None
        if not r.first_token:
            self._unqueue(r)
        self._in_flight[r.worker] -= 1
        self._snapshots.pop(r.worker, None)
        return r.worker

    def expect(self, request_id: str, hashes: Sequence[int], first_block: int, block_size: int) -> None:
        """The blocks (router hashes, at chain positions from `first_block` on) that this request's
        prefill computes: as the worker's KV events report them stored (`stored`), its queued
        prefill shrinks, so a long prefill under way counts only for what is left of it."""
        r = self._reqs.get(request_id)
        if r is None or r.first_token or not hashes:
            return
        pending = self._pending.setdefault(r.worker, {})
        for i, h in enumerate(hashes, start=first_block):
            pending[h] = (request_id, i)
        r.pending, r.block_size = tuple(hashes), block_size

    def stored(self, worker: str, hashes: Sequence[int]) -> None:
        """The worker stored these blocks (router hashes, from its KV events)."""
        pending = self._pending.get(worker)
        if not pending:
            return
        for h in hashes:
            hit = pending.pop(h, None)
            if hit is None:
                continue
            r = self._reqs.get(hit[0])
            if r is None or r.first_token or r.worker != worker:
                continue
            bs, i = r.block_size, hit[1]
            tokens, pairs = min(bs, r.prefill_tokens), min(bs * i * bs + bs * (bs + 1) // 2, r.prefill_pairs)
            r.prefill_tokens -= tokens
            r.prefill_pairs -= pairs
            self._queued[worker] -= tokens
            self._pairs[worker] -= pairs
            self._snapshots.pop(worker, None)

    def _unqueue(self, r: _Req) -> None:
        self._queued[r.worker] -= r.prefill_tokens
        self._pairs[r.worker] -= r.prefill_pairs
        self._snapshots.pop(r.worker, None)
        pending = self._pending.get(r.worker)
        if pending:
            for h in r.pending:
                pending.pop(h, None)
        r.pending = ()

    def set_scraped(self, worker: str, metrics: ScrapedMetrics, now: float) -> None:
        self._scraped[worker] = (now, metrics)
        self._snapshots.pop(worker, None)

    def set_remote(self, worker: str, in_flight: int, queued_prefill_tokens: int) -> None:
        """Other replicas' totals for `worker` (replaces the previous value)."""
        self._remote[worker] = (max(0, in_flight), max(0, queued_prefill_tokens))
        self._snapshots.pop(worker, None)

    def local(self, worker: str) -> tuple[int, int]:
        """This replica's (in_flight, queued_prefill_tokens), for publishing."""
        return self._in_flight.get(worker, 0), self._queued.get(worker, 0)

    def forget(self, worker: str) -> None:
        for d in (self._scraped, self._remote, self._snapshots, self._pending, self._assigned):
            d.pop(worker, None)

    def snapshot(self, worker: str, now: float) -> LoadSnapshot:
        kept = self._snapshots.get(worker)
        if kept is not None and now <= kept[0]:
            return kept[1]
        rin, rq = self._remote.get(worker, (0, 0))
        scraped = self._scraped.get(worker)
        fresh = scraped is not None and now - scraped[0] <= self._stale_after_s
        m = scraped[1] if scraped is not None and fresh else ScrapedMetrics()
        snap = LoadSnapshot(self._in_flight.get(worker, 0) + rin, self._queued.get(worker, 0) + rq,
                            m.running, m.waiting, m.kv_usage, self._pairs.get(worker, 0),
                            *self._assigned.get(worker, (0, 0)))
        until = scraped[0] + self._stale_after_s if scraped is not None and fresh else math.inf
        self._snapshots[worker] = (until, snap)
        return snap


_SCRAPED = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc", "vllm:cache_config_info")


def parse_vllm_metrics(text: str) -> ScrapedMetrics:
    """Parse vLLM's Prometheus exposition. Sums across engines/DP ranks; other lines are not read
    (`router/telemetry/exposition.py`).

    Raises ValueError on text that is not Prometheus exposition format.
    """
    sums: dict[str, float] = {}
    block_size = num_blocks = None
    for name, label_text, value in exposition.samples(text, _SCRAPED):
        if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            sums[name] = sums.get(name, 0.0) + value
        elif name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            if math.isfinite(value):
                sums["usage"] = max(sums.get("usage", 0.0), value)
        else:  # vllm:cache_config_info
            info = exposition.labels(label_text)
            block_size = _int_label(info, "block_size") or block_size
            num_blocks = _int_label(info, "num_gpu_blocks") or num_blocks
    running = _count(sums.get("vllm:num_requests_running"))
    waiting = _count(sums.get("vllm:num_requests_waiting"))
    return ScrapedMetrics(
        running=running,
        waiting=waiting,
        kv_usage=sums.get("usage"),
        block_size=block_size,
        num_gpu_blocks=num_blocks,
    )


def _count(value: float | None) -> int | None:
    """A request count; NaN, infinite or negative is unknown (int() of inf raises OverflowError)."""
    return int(value) if value is not None and math.isfinite(value) and value >= 0 else None


def _int_label(labels: dict[str, str], key: str) -> int | None:
    try:
        v = int(labels[key])
    except (KeyError, ValueError):
        return None
    return v if v > 0 else None


async def scrape_metrics(client: httpx.AsyncClient, base_url: str, timeout_s: float) -> ScrapedMetrics:
    """GET `<base_url>/metrics` and parse it. Raises httpx.HTTPError or ValueError."""
    resp = await client.get(base_url.rstrip("/") + "/metrics", timeout=timeout_s)
    resp.raise_for_status()
    return parse_vllm_metrics(resp.text)
