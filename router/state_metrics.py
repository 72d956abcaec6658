"""Router series read from the router's state at scrape time (no bookkeeping on the hot path).

Per worker, the two views of its load the router weighs:

- the gateway's own (exact, instant): `sluice_router_worker_queued_prefill_tokens{worker}`,
  the uncached prompt tokens dispatched by this replica and by the others (through Redis) that
  have no first token yet (requests in flight: `sluice_router_worker_in_flight{worker}`, set by
  the maintenance task);
- the engine's (scraped from the worker's /metrics, as old as the scrape interval):
  `sluice_router_worker_requests_running{worker}`, `..._requests_waiting{worker}` and
  `sluice_router_worker_kv_cache_usage_ratio{worker}`, absent while unknown or stale.

How unevenly the fleet is loaded: `sluice_router_load_imbalance_ratio`, max over mean of each
worker's outstanding work in seconds (the load part of its predicted time to first token,
`router.cost.queue_s`, with its learned coefficients); 1 when balanced or idle.

Whether the shared state in Redis is reachable: `sluice_router_redis_connected`, exported only
when Redis is configured. And the index's size: `sluice_router_index_memory_bytes`, an estimate from entry counts and
the per-entry sizes below (measured with tracemalloc on CPython 3.11; tests/router check
them), since walking the index at every scrape would cost what it measures.

The collector reads state that is not thread-safe, so it must be collected on the router's
event loop (the gateway's /metrics route and its metrics port both are).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from router.cost import queue_s
from router.state import RouterState

# One index entry: an OrderedDict slot (hash table entry, linked-list node) plus its 64-bit
# block-hash int; the expiry float is shared by a dispatch's whole chain.
INDEX_ENTRY_BYTES = 124
# One engine-hash -> router-hash mapping of a KV-event-fed worker: an OrderedDict slot, the
# engine hash int and a one-model tuple of router hashes (the hashes themselves are the index's).
MAPPED_BLOCK_BYTES = 170


class RouterStateCollector(Collector):
    def __init__(self, state: RouterState) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self._state
        now = s.clock()
        queued = GaugeMetricFamily("sluice_router_worker_queued_prefill_tokens",
                                   "Uncached prompt tokens dispatched to the worker with no first token yet "
                                   "(all gateway replicas), tokens.", labels=["worker"])
        running = GaugeMetricFamily("sluice_router_worker_requests_running",
                                    "Requests running on the worker, as its /metrics last said (all clients).",
                                    labels=["worker"])
        waiting = GaugeMetricFamily("sluice_router_worker_requests_waiting",
                                    "Requests waiting in the worker's engine, as its /metrics last said.",
                                    labels=["worker"])
        usage = GaugeMetricFamily("sluice_router_worker_kv_cache_usage_ratio",
                                  "KV-cache usage of the worker (0..1), as its /metrics last said.",
                                  labels=["worker"])
        entries = mapped = 0
        work = []
        for name, w in s.workers.items():
            load = s.load.snapshot(name, now)
            work.append(queue_s(s.learn.model(name), load))
            queued.add_metric([name], load.queued_prefill_tokens)
            for family, value in ((running, load.running), (waiting, load.waiting), (usage, load.kv_usage)):
                if value is not None:
                    family.add_metric([name], value)
            entries += s.index.size(name)
            mapped += w.applier.mapped_blocks
        memory = GaugeMetricFamily("sluice_router_index_memory_bytes",
                                   "Estimated memory of the prefix index and the KV-event hash maps, bytes "
                                   "(entry counts times measured per-entry sizes).")
        memory.add_metric([], entries * INDEX_ENTRY_BYTES + mapped * MAPPED_BLOCK_BYTES)
        balance = GaugeMetricFamily("sluice_router_load_imbalance_ratio",
                                    "Max over mean of the workers' outstanding work (the load part of their "
                                    "predicted time to first token), ratio; 1 when balanced or idle.")
        balance.add_metric([], imbalance(work))
        yield from (queued, running, waiting, usage, memory, balance)
        if s.shared is not None and s.shared.backend == "redis":  # only with --redis-url: 0 always means "lost"
            redis = GaugeMetricFamily("sluice_router_redis_connected",
                                      "1 while the routing state shared in Redis is reachable, else 0.")
            redis.add_metric([], 1 if s.shared.connected else 0)
            yield redis

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # values exist only at scrape time


def imbalance(work: Sequence[float]) -> float:
    """Max over mean of per-worker work; 1.0 when there is none (an idle fleet is balanced)."""
    total = sum(work)
    return max(work) * len(work) / total if total > 0 else 1.0
