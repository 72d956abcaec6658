"""The gateway's Prometheus registry and the LLM metric set.

One `CollectorRegistry` per app (tests start several apps in one process).
Router and KServe collectors register onto the same registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engines.base import EngineStats

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class LLMMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "sluice_requests", "HTTP requests by route, model and status code.",
            ["route", "model", "status"], registry=registry,
        )
        self.prompt_tokens = Counter("sluice_prompt_tokens", "Prompt tokens processed.", ["model"],
                                     registry=registry)
        self.generation_tokens = Counter("sluice_generation_tokens", "Tokens generated.", ["model"],
                                         registry=registry)
        self.cached_tokens = Counter("sluice_cached_prompt_tokens",
                                     "Prompt tokens the engine served from its prefix cache.", ["model"],
                                     registry=registry)
        self.ttft = Histogram("sluice_time_to_first_token_seconds", "Time to first token.", ["model"],
                              buckets=_LATENCY_BUCKETS_S, registry=registry)
        self.itl = Histogram("sluice_inter_token_latency_seconds", "Time between streamed deltas.", ["model"],
                             buckets=_ITL_BUCKETS_S, registry=registry)
        self.e2e = Histogram("sluice_e2e_request_latency_seconds", "End-to-end request latency.", ["model"],
                             buckets=_LATENCY_BUCKETS_S, registry=registry)
        self.queue_time = Histogram("sluice_queue_time_seconds", "Time spent waiting for admission.", ["model"],
                                    buckets=_LATENCY_BUCKETS_S, registry=registry)
        self.inflight = Gauge("sluice_requests_inflight", "Requests admitted and not finished.", ["model"],
                              registry=registry)
        self.queued = Gauge("sluice_requests_queued", "Requests waiting for admission.", ["model"],
                            registry=registry)
        self.retries = Counter("sluice_request_retries", "Requests moved to the next-ranked worker after a "
                               "failure before the first byte.", ["model"], registry=registry)
        self.finished = Counter("sluice_request_finished", "Finished generations by reason.",
                                ["model", "finish_reason"], registry=registry)


class EngineStatsCollector(Collector):
    """Exports each in-process engine's scheduler snapshot at scrape time."""

    def __init__(self, source: Callable[[], Iterable[tuple[str, EngineStats]]]) -> None:
        self._source = source

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        running = GaugeMetricFamily("sluice_engine_requests_running",
                                    "Requests in the engine's running batch.", labels=["model"])
        waiting = GaugeMetricFamily("sluice_engine_requests_waiting",
                                    "Requests queued inside the engine.", labels=["model"])
        batch = GaugeMetricFamily("sluice_engine_max_batch_size",
                                  "Largest batch the engine has run since start.", labels=["model"])
        steps = CounterMetricFamily("sluice_engine_steps", "Forward passes the engine has run.", labels=["model"])
        batched = CounterMetricFamily("sluice_engine_batched_steps",
                                      "Forward passes that ran more than one request.", labels=["model"])
        restarts = CounterMetricFamily("sluice_engine_restarts",
                                       "Times the engine's supervisor restarted it after its generation loop "
                                       "died.", labels=["model"])
        for model, stats in self._source():
            running.add_metric([model], stats.running)
            waiting.add_metric([model], stats.waiting)
            batch.add_metric([model], stats.max_batch_size_seen)
            steps.add_metric([model], stats.steps)
            batched.add_metric([model], stats.batched_steps)
            restarts.add_metric([model], stats.restarts)
        yield from (running, waiting, batch, steps, batched, restarts)
