"""The router's scrape-time series: both views of a worker's load, the index's memory estimate
(checked against a tracemalloc measurement) and the Redis gauge that exists only with Redis."""

from __future__ import annotations

import random
import tracemalloc

from prometheus_client import CollectorRegistry

from router import Router, RouterConfig, WorkerInfo
from router.index.applier import EventApplier
from router.index.events import BlockStored
from router.index.hashing import block_hashes, root_hash
from router.index.prefix_index import PrefixIndex
from router.state_metrics import INDEX_ENTRY_BYTES, MAPPED_BLOCK_BYTES
from router.telemetry.load import ScrapedMetrics
from tests.router.test_router import Clock


def _router() -> tuple[Router, CollectorRegistry]:
    reg = CollectorRegistry()
    r = Router(RouterConfig(), registry=reg, clock=Clock())
    for n in ("w0", "w1"):
        r.add_worker(WorkerInfo(n, f"http://127.0.0.1:1/{n}", ("m",), block_size=4))
    return r, reg


def test_both_views_of_a_workers_load() -> None:
    r, reg = _router()
    rk = r.rank("m", list(range(1, 21)))
    r.on_dispatch("a", rk, "w0")
    assert reg.get_sample_value("sluice_router_worker_queued_prefill_tokens", {"worker": "w0"}) == 20
    assert reg.get_sample_value("sluice_router_worker_queued_prefill_tokens", {"worker": "w1"}) == 0
    r.on_first_token("a")
    assert reg.get_sample_value("sluice_router_worker_queued_prefill_tokens", {"worker": "w0"}) == 0
    # The engine's view exists only once the worker's /metrics said something.
    assert reg.get_sample_value("sluice_router_worker_requests_running", {"worker": "w0"}) is None
    r.feed.apply_scrape("w0", ScrapedMetrics(running=3, waiting=2, kv_usage=0.25))
    assert reg.get_sample_value("sluice_router_worker_requests_running", {"worker": "w0"}) == 3
    assert reg.get_sample_value("sluice_router_worker_requests_waiting", {"worker": "w0"}) == 2
    assert reg.get_sample_value("sluice_router_worker_kv_cache_usage_ratio", {"worker": "w0"}) == 0.25
    assert reg.get_sample_value("sluice_router_worker_requests_running", {"worker": "w1"}) is None
    r.remove_worker("w0")
    assert reg.get_sample_value("sluice_router_worker_queued_prefill_tokens", {"worker": "w0"}) is None


def test_redis_gauge_only_with_redis() -> None:
    _, reg = _router()
    assert reg.get_sample_value("sluice_router_redis_connected") is None  # absent, not a misleading 0


def test_index_memory_counts_entries() -> None:
    r, reg = _router()
    prompt = list(range(1, 41))  # 10 blocks of 4
    rk = r.rank("m", prompt)
    r.on_dispatch("a", rk, "w1")
    assert reg.get_sample_value("sluice_router_index_memory_bytes") == 10 * INDEX_ENTRY_BYTES


def _measure(build: callable) -> float:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        entries = build()
        return (tracemalloc.get_traced_memory()[0] - before) / entries
    finally:
        tracemalloc.stop()


def test_documented_entry_sizes_match_a_measurement() -> None:
    """The per-entry constants are within 35% of what CPython allocates for them (the spread
    comes from hash-table growth steps)."""
    rng = random.Random(7)
    root = root_hash("m", None, None)

    def speculative() -> int:
        index = PrefixIndex(1 << 20)
        index.add_worker("w")
        for _ in range(600):
            index.store("w", block_hashes([rng.randrange(50_000) for _ in range(16 * 16)], 16, root),
                        expires_at=1e9)
        speculative.keep = index  # type: ignore[attr-defined]  # alive until measured
        return index.size("w")

    per_index_entry = _measure(speculative)
    assert 0.65 * per_index_entry <= INDEX_ENTRY_BYTES <= 1.35 * per_index_entry, per_index_entry

    events = [BlockStored(tuple(rng.getrandbits(63) for _ in range(16)), None,
                          tuple(rng.randrange(50_000) for _ in range(16 * 16)), 16) for _ in range(600)]

    def exact() -> int:
        index = PrefixIndex(1 << 20)
        index.add_worker("w")
        applier = EventApplier("w", ("m",), index, 1 << 20)
        for ev in events:
            applier.apply(ev)
        exact.keep = (index, applier)  # type: ignore[attr-defined]
        return applier.mapped_blocks

    # The events' engine-hash ints were allocated before the measurement; the map keeps them alive.
    per_exact_block = _measure(exact) + 32
    estimate = INDEX_ENTRY_BYTES + MAPPED_BLOCK_BYTES
    assert 0.65 * per_exact_block <= estimate <= 1.35 * per_exact_block, per_exact_block
